#!/usr/bin/env python
"""Distributed collectors side by side: first batch, throughput, shutdown, trainer CPU.

Compares, in ONE run and on the same workloads (env + 64-64 MLP policy, 2 collection nodes
started as local processes, ``launcher="mp"``, ``backend="gloo"``, one env per node):

* aiocollect's ``DistributedCollector(sync=True)``, ``DistributedCollector(sync=False)`` and
  ``DistributedSyncCollector`` (their blocking twins in a plain ``for`` loop), with
  ``collector_class=Collector``;
* TorchRL's ``DistributedCollector`` (``sync=True`` and ``sync=False``) and
  ``DistributedSyncCollector`` (``torchrl.collectors.distributed``; the ``...DataCollector``
  names on older TorchRL), each run with its own free ``tcp_port``;
* a bare hand-written loop (``bench_collect.bare_loop``: one env, the same policy, one
  process), the reference for throughput (ratio 1.00).

Workloads: CartPole-v1, and the "heavy" CartPole-like env of ``bench_multi.py`` whose step
burns about 1 ms of pure-Python CPU. Every configuration runs in a fresh Python process
(``python -c``, its own process group, killed on timeout) that prints one JSON line: the time
from the constructor call to the first batch (compared with the wall time of
``python -c "import torch, gymnasium"`` measured in the same run: no node can start faster),
steady-state frames/s over N batches after a warmup, the time from ``break`` to the
collector's shutdown returning and to every node process being gone, and the trainer
process's CPU use while it waits for batches. A configuration that fails or hangs is
recorded with its error and the run goes on. The output ends with a table, the
aiocollect/TorchRL and aiocollect/bare ratios, and a Markdown table.

Usage::

    python benchmarks/bench_distributed.py            # full run (about 9 min on 2 idle cores)
    python benchmarks/bench_distributed.py --quick    # CI smoke (about 1.5 min on 2 idle cores)

See benchmarks/README.md for what each row means and the fairness rules.

Everything a node process needs (the policy class, the env factories) is defined at module
level here, and this module imports only the standard library, torch and gymnasium at the
top: nodes re-import it to unpickle those, and must not pay for anything else.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import gymnasium as gym
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.wrappers import TimeLimit
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
NUM_NODES = 2
HEAVY_WORK = 8000  # as bench_multi.py: iterations of _burn per HeavyEnv step, about 1 ms
REFERENCE_CMD = "import torch, gymnasium"
# For information: a node that runs a collector also needs tensordict (TensorDict batches).
TD_REFERENCE_CMD = "import torch, gymnasium, tensordict"
RESULT_TAG = "BENCH_DISTRIBUTED_RESULT "  # prefixes the child's JSON line on stdout

# --------------------------------------------------------------------------------------------
# What node processes import: the policy and the env factories (module level: picklable).
# --------------------------------------------------------------------------------------------


class ArgmaxMLP(nn.Module):
    """The benchmarks' 64-64 MLP (``Linear-Tanh-Linear-Tanh-Linear``), obs -> int64 action;
    the same module and weights as ``bench_collect.DiscretePolicy(4, 2)`` after
    ``torch.manual_seed(0)``."""

    def __init__(self, n_obs: int = 4, n_act: int = 2) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(n_obs, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_act))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.mlp(observation).argmax(-1)


def _burn(n: int) -> int:
    """bench_multi's deterministic pure-Python CPU work (a Lehmer RNG)."""
    x = 1
    for _ in range(n):
        x = (x * 48271) % 2147483647
    return x


class HeavyEnv(CartPoleEnv):
    """bench_multi's heavy env: CartPole (4 float32 obs, 2 actions, same dynamics) whose step
    also burns ``work`` iterations of pure-Python arithmetic (holds the GIL, like a Python
    simulator), about 1 ms of CPU for the default ``HEAVY_WORK``."""

    def __init__(self, work: int = HEAVY_WORK) -> None:
        super().__init__()
        self.work = work
        self.sink = 0

    def step(self, action: Any) -> Any:
        out = super().step(action)
        self.sink = _burn(self.work)
        return out


def make_cartpole() -> gym.Env:
    return gym.make("CartPole-v1")


def make_heavy(work: int = HEAVY_WORK) -> gym.Env:
    return TimeLimit(HeavyEnv(work), max_episode_steps=500)  # CartPole-v1's limit


def trl_cartpole() -> Any:
    """TorchRL's env for one CartPole, as bench_collect's single-env TorchRL rows build it."""
    from torchrl.envs import GymEnv

    return GymEnv("CartPole-v1", categorical_action_encoding=True)


def trl_heavy(work: int = HEAVY_WORK) -> Any:
    """The heavy env in TorchRL's GymWrapper, as bench_multi builds it."""
    from torchrl.envs import GymWrapper

    return GymWrapper(make_heavy(work), categorical_action_encoding=True)


WORKLOADS: dict[str, dict[str, Any]] = {
    # node_fpb: frames one node collects per batch; frames: timed frames of a run (full, quick)
    "cartpole": {
        "title": "CartPole-v1 x1/node",
        "node_fpb": 200,
        "frames": (16_000, 6_000),
    },
    "heavy": {
        "title": "Heavy (~1 ms/step) x1/node",
        "node_fpb": 100,
        "frames": (3_000, 1_200),
    },
}


def env_factories(workload: str, work: int) -> tuple[Any, Any]:
    """(aiocollect's and the bare loop's env factory, TorchRL's) for ``workload``."""
    if workload == "cartpole":
        return make_cartpole, trl_cartpole
    return functools.partial(make_heavy, work), functools.partial(trl_heavy, work)


# Configurations: (key, library, role, label). The role pairs aiocollect with TorchRL.
CONFIGS: list[tuple[str, str, str | None, str]] = [
    ("bare", "bare", None, "bare loop (1 process, 1 env)"),
    ("aio-sync", "aiocollect", "sync", "aiocollect DistributedCollector(sync=True)"),
    ("aio-async", "aiocollect", "async", "aiocollect DistributedCollector(sync=False)"),
    ("aio-free", "aiocollect", "free", "aiocollect DistributedSyncCollector"),
    ("trl-sync", "torchrl", "sync", "TorchRL DistributedCollector(sync=True)"),
    ("trl-async", "torchrl", "async", "TorchRL DistributedCollector(sync=False)"),
    ("trl-free", "torchrl", "free", "TorchRL DistributedSyncCollector"),
]
CONFIG_KEYS = [c[0] for c in CONFIGS]
QUICK_CONFIGS = {  # --quick: TorchRL's start and shutdown cost ~10 s a run; keep one of them
    "cartpole": ["bare", "aio-sync", "aio-async", "aio-free", "trl-sync"],
    "heavy": ["bare", "aio-sync", "aio-async", "aio-free"],
}
_TRL_NAMES = {  # 0.14 names first, then the legacy ones
    "sync": ("DistributedCollector", "DistributedDataCollector"),
    "async": ("DistributedCollector", "DistributedDataCollector"),
    "free": ("DistributedSyncCollector", "DistributedSyncDataCollector"),
}


def frames_per_batch(role: str | None, node_fpb: int) -> int:
    """What the caller receives per batch: every node's share where they are gathered."""
    return node_fpb if role in (None, "async") else NUM_NODES * node_fpb


# --------------------------------------------------------------------------------------------
# The child process: one configuration, one fresh interpreter.
# --------------------------------------------------------------------------------------------

_HELPERS = ("resource_tracker", "forkserver", "semaphore_tracker", "torch_shm_manager")


def node_processes(psutil: Any) -> list[Any]:
    """This process's descendants that are nodes: all but its direct-child helpers (resource
    tracker, fork server; processes forked by a fork server share its command line but are
    its children, not ours)."""
    me = os.getpid()
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
            if p.ppid() == me and any(h in cmd for h in _HELPERS):
                continue
            out.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return out


def _alive(psutil: Any, p: Any) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _cpu_s(psutil: Any, procs: list[Any]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system  # the process itself, not its children
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


def _count_dones(batch: Any) -> int:
    if isinstance(batch, dict):  # the bare loop's buffers
        return int(batch["done"].sum())
    return int(batch.get(("next", "done")).sum())


def _batch_frames(batch: Any) -> int:
    return batch.numel() if hasattr(batch, "numel") else int(batch["reward"].numel())


def _make_collector(cfg: dict[str, Any], policy: nn.Module) -> tuple[Any, Any]:
    """(an iterable of batches, its shutdown function or None) for the configuration."""
    aio_env, trl_env = env_factories(cfg["workload"], cfg["heavy_work"])
    fpb, total, lib, role = cfg["fpb"], cfg["total_frames"], cfg["lib"], cfg["role"]
    envs = [aio_env] * NUM_NODES
    if lib == "bare":
        sys.path.insert(0, HERE)
        import bench_collect as bc  # imports aiocollect and anyio: not in the distributed rows

        return bc.bare_loop(aio_env, policy, fpb, total, same_step=True), None
    if lib == "aiocollect":
        import aiocollect
        import aiocollect.blocking as ab

        common = {
            "frames_per_batch": fpb, "total_frames": total, "launcher": "mp",
            "collector_class": aiocollect.Collector, "backend": "gloo",
        }  # fmt: skip
        if role == "free":
            c = ab.DistributedSyncCollector(envs, policy, **common)
        else:
            c = ab.DistributedCollector(envs, policy, sync=role == "sync", **common)
        return c, c.shutdown
    import logging

    import torchrl.collectors.distributed as trd
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector as TrlCollector

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    cls = next(getattr(trd, n) for n in _TRL_NAMES[role] if hasattr(trd, n))
    module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
    common = {
        "frames_per_batch": fpb, "total_frames": total, "launcher": "mp",
        "collector_class": TrlCollector, "backend": "gloo", "tcp_port": cfg["tcp_port"],
    }  # fmt: skip
    envs = [trl_env] * NUM_NODES
    if role == "free":
        c = cls(envs, module, **common)
    else:
        c = cls(envs, module, sync=role == "sync", **common)
    return c, c.shutdown


def child_main(cfg: dict[str, Any], t_start: float, make: Any = None, find_nodes: Any = None) -> dict[str, Any]:
    """One configuration in this process. ``make(cfg, policy)`` builds the collector (default:
    this module's distributed rows) and ``find_nodes(psutil)`` lists its node processes (default:
    this process's descendants but its helpers); bench_ray_rpc.py passes its own."""
    import warnings

    import psutil

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    torch.manual_seed(0)
    policy = ArgmaxMLP(4, 2)
    me = psutil.Process()
    warm, n = cfg["warm_batches"], cfg["batches"]
    out: dict[str, Any] = {"pid": os.getpid()}

    t_lib = time.perf_counter()
    if cfg["lib"] == "aiocollect":
        import aiocollect.blocking  # noqa: F401 - the import is not part of the first batch
    elif cfg["lib"] == "torchrl":
        import torchrl.collectors.distributed  # noqa: F401
    out["import_s"] = time.perf_counter() - t_start  # python start to here: torch, gym, lib
    out["lib_import_s"] = time.perf_counter() - t_lib

    stamps: list[float] = []
    frames: list[int] = []
    dones = 0
    nodes: list[Any] = []
    cpu0 = cpu1 = nodes_cpu0 = nodes_cpu1 = 0.0
    shutdown = None
    t0 = time.perf_counter()
    try:
        it, shutdown = (make or _make_collector)(cfg, policy)
        for i, batch in enumerate(it):
            stamps.append(time.perf_counter())
            frames.append(_batch_frames(batch))
            dones += _count_dones(batch)
            if i == warm - 1:  # the steady window starts with the last warmup batch in hand
                nodes = (find_nodes or node_processes)(psutil) if cfg["lib"] != "bare" else []
                cpu0, nodes_cpu0 = _cpu_s(psutil, [me]), _cpu_s(psutil, nodes)
            if i == warm + n - 1:
                cpu1, nodes_cpu1 = _cpu_s(psutil, [me]), _cpu_s(psutil, nodes)
                break
    except BaseException as exc:
        import traceback

        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-3000:]
    t_break = time.perf_counter()
    if shutdown is not None:
        try:
            shutdown()
        except BaseException as exc:
            out.setdefault("error", f"shutdown: {type(exc).__name__}: {exc}")
    t_closed = time.perf_counter()
    # Every node process recorded in the steady window must be gone (a zombie counts as
    # gone: it has exited and only waits for its parent to read its status).
    deadline = t_closed + cfg["gone_timeout"]
    left = [p for p in nodes if _alive(psutil, p)]
    while left and time.perf_counter() < deadline:
        time.sleep(0.005)
        left = [p for p in left if _alive(psutil, p)]
    t_gone = time.perf_counter()
    if left:
        out["left_alive"] = [p.pid for p in left]
        for p in left:  # so that this process can exit; the parent reports the leak
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    out["batches"] = len(stamps)
    out["frames"] = sum(frames)
    out["dones"] = dones
    out["node_pids"] = [p.pid for p in nodes]
    if stamps:
        out["first_s"] = stamps[0] - t0
    if len(stamps) == warm + n:
        wall = stamps[-1] - stamps[warm - 1]
        out["steady_s"] = wall
        out["fps"] = sum(frames[warm:]) / wall
        out["trainer_cpu"] = (cpu1 - cpu0) / wall
        out["trainer_ms_per_batch"] = (cpu1 - cpu0) / n * 1e3
        out["nodes_cpu"] = (nodes_cpu1 - nodes_cpu0) / wall if nodes else None
        out["batch_ms_p50"] = statistics.median(
            (b - a) * 1e3 for a, b in zip(stamps[warm - 1 :], stamps[warm:], strict=False)
        )
    elif "error" not in out:
        out["error"] = f"the collector stopped after {len(stamps)} of {warm + n} batches"
    out["close_s"] = t_closed - t_break  # break -> shutdown returned
    out["gone_s"] = None if left else t_gone - t_break  # break -> every node process gone
    return out


def _child_entry(cfg_json: str, t_start: float) -> None:
    """``python -c`` entry point of a child (see `run_child`)."""
    try:
        res = child_main(json.loads(cfg_json), t_start)
    except BaseException as exc:  # reported to the parent as data
        import traceback

        res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    print(RESULT_TAG + json.dumps(res), flush=True)


# --------------------------------------------------------------------------------------------
# The parent: fresh processes, each in its own process group, killed on timeout.
# --------------------------------------------------------------------------------------------


def _group_alive(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    alive = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rindex(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":  # fields: state, ppid, pgrp, ...
            alive.append(int(name))
    return alive


def _killpg(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def run_process(argv: list[str], timeout: float, exit_grace: float) -> dict[str, Any]:
    """Run ``argv`` in a new session. Returns its result line (parsed), or what went wrong:
    a timeout (no result within ``timeout`` s), a process that printed its result but did not
    exit within ``exit_grace`` s after it, processes of its group left alive 5 s after it
    exited (killed)."""
    t0 = time.perf_counter()
    err_file = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err_file, text=True, start_new_session=True)
    result: list[dict[str, Any]] = []
    wake = threading.Event()  # the result line arrived, or the process ended
    t_exit: list[float] = []

    def read() -> None:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith(RESULT_TAG):
                result.append(json.loads(line[len(RESULT_TAG) :]))
                wake.set()

    def wait() -> None:
        p.wait()
        t_exit.append(time.perf_counter())
        wake.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    threading.Thread(target=wait, daemon=True).start()
    note = None
    try:
        wake.wait(timeout)
        if not t_exit:
            if result:
                try:
                    p.wait(exit_grace)
                except subprocess.TimeoutExpired:
                    note = f"did not exit within {exit_grace:g} s after its result (killed)"
            else:
                note = f"timed out after {timeout:g} s (killed)"
    except BaseException:  # Ctrl-C: the child is in its own session and did not get it
        _killpg(p.pid)
        p.wait()
        raise
    if p.poll() is None:
        _killpg(p.pid)
        p.wait()
    wall = (t_exit[0] if t_exit else time.perf_counter()) - t0
    reader.join(5.0)
    deadline = time.perf_counter() + 5.0
    left = _group_alive(p.pid)
    while left and time.perf_counter() < deadline:
        time.sleep(0.05)
        left = _group_alive(p.pid)
    if left:
        _killpg(p.pid)
    err_file.seek(0)
    stderr = err_file.read()
    err_file.close()
    res = result[0] if result else {}
    if not result:
        why = note or f"exited with {p.returncode}"
        res["error"] = f"child {why} without a result"
    elif note:
        res["exit_note"] = note
    if "error" in res:
        res["stderr"] = stderr[-3000:]
    res["wall_s"] = wall
    res["returncode"] = p.returncode
    res["group_left_alive"] = left
    return res


def time_command(code: str, timeout: float) -> float:
    r = run_process([sys.executable, "-c", code], timeout, 5.0)
    return math.nan if r.get("returncode") != 0 else r["wall_s"]


def run_child(cfg: dict[str, Any], timeout: float, exit_grace: float) -> dict[str, Any]:
    code = (
        "import time; _t = time.perf_counter(); import sys; "
        f"sys.path.insert(0, {HERE!r}); import bench_distributed; "
        "bench_distributed._child_entry(sys.argv[1], _t)"
    )
    return run_process([sys.executable, "-c", code, json.dumps(cfg)], timeout, exit_grace)


def free_port_block(used: set[int], width: int = 3) -> int:
    """A port p < 65536 such that p .. p + width - 1 are all free now (bound together, then
    released) and none was handed out before in this run. TorchRL 0.14.1 uses ``tcp_port``
    (init_process_group's rendezvous), ``tcp_port + 1`` (its TCPStore, retried on a random
    free port if taken) and ``tcp_port + 2`` (the weight sync scheme's TCPStore)."""
    for _ in range(200):
        socks: list[socket.socket] = []
        try:
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            socks.append(s)
            s.bind(("", 0))
            port = s.getsockname()[1]
            block = set(range(port, port + width))
            if port + width - 1 >= 65536 or block & used:
                continue
            for q in range(port + 1, port + width):
                t = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(t)
                t.bind(("", q))
            used |= block
            return port
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("found no block of free TCP ports")


# --------------------------------------------------------------------------------------------
# Summaries and formatting
# --------------------------------------------------------------------------------------------


def _median(values: list[Any]) -> float:
    v = [x for x in values if isinstance(x, (int, float)) and math.isfinite(x)]
    return statistics.median(v) if v else math.nan


def fmt_x(x: float) -> str:
    return f"{x:.2f}x" if math.isfinite(x) else "n/a"


def fmt_n(x: float, digits: int = 0, sep: bool = False) -> str:
    if not math.isfinite(x):
        return "n/a"
    return f"{x:,.{digits}f}" if sep else f"{x:.{digits}f}"


def fmt_pct(x: float) -> str:
    return f"{x * 100:.0f}%" if math.isfinite(x) else "n/a"


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    fps = [r["fps"] for r in ok]
    frames = sum(r["frames"] for r in ok)
    dones = sum(r["dones"] for r in ok)
    return {
        "runs": len(runs),
        "ok": len(ok),
        "errors": [r["error"] for r in runs if "error" in r],
        "fps": _median(fps),
        "spread": (max(fps) - min(fps)) / statistics.median(fps) if len(fps) > 1 else 0.0,
        "first_s": _median([r.get("first_s") for r in ok]),
        "close_s": _median([r.get("close_s") for r in ok]),
        "gone_s": _median([r.get("gone_s") for r in ok]),
        "trainer_cpu": _median([r.get("trainer_cpu") for r in ok]),
        "trainer_ms_per_batch": _median([r.get("trainer_ms_per_batch") for r in ok]),
        "nodes_cpu": _median([r.get("nodes_cpu") for r in ok]),
        "batch_ms": _median([r.get("batch_ms_p50") for r in ok]),
        "import_s": _median([r.get("import_s") for r in ok]),
        "ep_len": frames / dones if dones else math.inf,
        "leaks": [
            (r.get("left_alive") or []) + (r.get("group_left_alive") or [])
            for r in runs
            if r.get("left_alive") or r.get("group_left_alive")
        ],
        "exit_notes": [r["exit_note"] for r in runs if "exit_note" in r],
    }


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="See benchmarks/README.md for what each row means.",
    )
    ap.add_argument("--quick", action="store_true", help="short CI smoke run (about 1.5 min)")
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="fresh processes per configuration (default 3; 1 with --quick); the median is reported",
    )
    ap.add_argument(
        "--workload",
        action="append",
        choices=list(WORKLOADS),
        help="run only this workload (repeatable)",
    )
    ap.add_argument(
        "--config",
        action="append",
        choices=CONFIG_KEYS,
        help="run only this configuration (repeatable; default: all, or a subset with --quick)",
    )
    ap.add_argument(
        "--frames-scale",
        type=float,
        default=1.0,
        help="multiply the timed frames of every run by this (default 1)",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="batches before the steady window (default 3; 2 with --quick)",
    )
    ap.add_argument(
        "--heavy-work",
        type=int,
        default=HEAVY_WORK,
        help=f"iterations of pure-Python work per heavy step (default {HEAVY_WORK}, ~1 ms)",
    )
    ap.add_argument("--no-torchrl", action="store_true", help="skip the TorchRL configurations")
    ap.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds a configuration's process may take to report before it and its nodes are killed (default 180)",
    )
    ap.add_argument(
        "--gone-timeout",
        type=float,
        default=30.0,
        help="seconds to wait after shutdown for the node processes to be gone (default 30)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    repeats = args.repeats or (1 if quick else 3)
    warm = args.warmup or (2 if quick else 3)
    t_start = time.perf_counter()
    load_start = _loadavg()

    def log(msg: str = "") -> None:
        print(msg, flush=True)

    import importlib.util

    import aiocollect  # lazy: this imports neither tensordict nor the collectors

    has_trl = importlib.util.find_spec("torchrl") is not None
    trl_note = "disabled with --no-torchrl" if args.no_torchrl else None if has_trl else "torchrl is not installed"
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensordict": _dist_version("tensordict"),
        "gymnasium": gym.__version__,
        "torchrl": _dist_version("torchrl") if trl_note is None else "not used",
        "aiocollect": aiocollect.__version__,
    }
    workloads = [w for w in WORKLOADS if not args.workload or w in args.workload]
    plan: dict[str, list[str]] = {}
    for w in workloads:
        keys = args.config or (QUICK_CONFIGS[w] if quick else CONFIG_KEYS)
        plan[w] = [k for k in keys if not (trl_note and k.startswith("trl"))]
    labels = {k: (lib, role, label) for k, lib, role, label in CONFIGS}

    log(
        f"bench_distributed: {'QUICK' if quick else 'full'} run, {repeats} fresh process(es) "
        f"per configuration, {NUM_NODES} nodes (launcher='mp', backend='gloo', one env per node)"
    )
    log(f"  {platform.platform()}, {os.cpu_count()} CPUs, {sys.executable}")
    log("  " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    log(f"  aiocollect from {os.path.dirname(aiocollect.__file__)}")
    if trl_note:
        log(f"  NOTE: TorchRL configurations skipped ({trl_note})")
    probe = []
    for _ in range(50):
        t = time.perf_counter()
        _burn(args.heavy_work)
        probe.append(time.perf_counter() - t)
    burn_ms = statistics.median(probe) * 1e3
    log(
        f"  heavy env: {args.heavy_work} work iterations per step = {burn_ms:.2f} ms of CPU here "
        f"(median; fastest {min(probe) * 1e3:.2f} ms)"
    )
    log(f"  load average (1 min) at start: {load_start:.2f}")
    if load_start > 0.5:
        log("  WARNING: the machine is not idle; other processes share the CPUs and add noise.")

    used_ports: set[int] = set()
    ref_runs: list[float] = []
    td_ref_runs: list[float] = []
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(w, k): [] for w in workloads for k in plan[w]}
    n_ref = max(repeats, 3)
    log("\nfresh processes, round robin (the import reference, then every configuration)")
    for rep in range(max(repeats, n_ref)):
        ref_runs.append(time_command(REFERENCE_CMD, args.timeout))
        td_ref_runs.append(time_command(TD_REFERENCE_CMD, args.timeout))
        log(
            f'  round {rep + 1}: `python -c "{REFERENCE_CMD}"` {ref_runs[-1]:.2f} s '
            f"(with tensordict {td_ref_runs[-1]:.2f} s)"
        )
        if rep >= repeats:
            continue
        for w in workloads:
            spec = WORKLOADS[w]
            for key in plan[w]:
                lib, role, label = labels[key]
                fpb = frames_per_batch(role, spec["node_fpb"])
                timed = spec["frames"][1 if quick else 0] * args.frames_scale
                batches = max(2, math.ceil(timed / fpb))
                cfg = {
                    "workload": w,
                    "key": key,
                    "lib": lib,
                    "role": role,
                    "fpb": fpb,
                    "warm_batches": warm,
                    "batches": batches,
                    "total_frames": (warm + batches) * fpb,
                    "heavy_work": args.heavy_work,
                    "gone_timeout": args.gone_timeout,
                    "tcp_port": free_port_block(used_ports) if lib == "torchrl" else None,
                }
                r = run_child(cfg, args.timeout, exit_grace=15.0)
                r["tcp_port"] = cfg["tcp_port"]
                results[(w, key)].append(r)
                port = f" (tcp_port {cfg['tcp_port']})" if cfg["tcp_port"] else ""
                if "error" in r:
                    log(f"    {w:<8} {label:<44} ERROR{port}: {r['error']}")
                    tail = (r.get("traceback") or r.get("stderr") or "").strip().splitlines()
                    for t in tail[-8:]:
                        log(f"      {t}")
                    continue
                gone = "n/a" if r.get("gone_s") is None else f"{r['gone_s'] * 1e3:.0f}"
                msg = (
                    f"    {w:<8} {label:<44} {r['fps']:7.0f} frames/s  first "
                    f"{r['first_s']:5.2f} s  close {r['close_s'] * 1e3:5.0f} ms  gone {gone} ms"
                    f"  trainer CPU {r['trainer_cpu'] * 100:3.0f}%  (process {r['wall_s']:.1f} s)"
                )
                log(msg + port)
                for what in ("left_alive", "group_left_alive", "exit_note"):
                    if r.get(what):
                        log(f"      WARNING: {what}: {r[what]}")

    # ------------------------------------------------------------------------------ results
    ref = _median(ref_runs)
    td_ref = _median(td_ref_runs)
    summ = {wk: summarize(runs) for wk, runs in results.items()}
    table: list[dict[str, Any]] = []
    for w in workloads:
        bare = summ.get((w, "bare"))
        for key in plan[w]:
            lib, role, label = labels[key]
            s = summ[(w, key)]
            trl = summ.get((w, "trl-" + role)) if lib == "aiocollect" and role else None
            table.append(
                {
                    "workload": WORKLOADS[w]["title"],
                    "workload_key": w,
                    "config": key,
                    "row": label,
                    "lib": lib,
                    "role": role,
                    "fpb": frames_per_batch(role, WORKLOADS[w]["node_fpb"]),
                    **s,
                    "vs_bare": s["fps"] / bare["fps"] if bare else math.nan,
                    "vs_torchrl": s["fps"] / trl["fps"] if trl else math.nan,
                    "first_vs_torchrl": s["first_s"] / trl["first_s"] if trl else math.nan,
                    "gone_vs_torchrl": s["gone_s"] / trl["gone_s"] if trl else math.nan,
                    "first_vs_import": s["first_s"] / ref if ref else math.nan,
                    "runs_detail": results[(w, key)],
                }
            )

    log("\n" + "=" * 150)
    log(
        f"RESULTS: medians of {repeats} fresh process(es) per row; floor = `python -c "
        f'"{REFERENCE_CMD}"` = {ref:.2f} s (median of {len(ref_runs)}; `{TD_REFERENCE_CMD}` '
        f"{td_ref:.2f} s)"
    )
    hdr = (
        f"{'workload':<27} {'row':<44} {'fpb':>4} {'frames/s':>9} {'x bare':>7} "
        f"{'x TorchRL':>9} {'1st s':>6} {'/floor':>7} {'close ms':>8} {'gone ms':>8} "
        f"{'trainer':>7} {'ms/b':>5} {'nodes':>6} {'spread':>6} {'ep len':>6}"
    )
    log(hdr)
    log("-" * len(hdr))
    for t in table:
        if not t["ok"]:
            log(f"{t['workload']:<27} {t['row']:<44} FAILED: {'; '.join(t['errors'])[:200]}")
            continue
        fail = f"  ({t['runs'] - t['ok']} of {t['runs']} runs failed)" if t["errors"] else ""
        log(
            f"{t['workload']:<27} {t['row']:<44} {t['fpb']:>4} {fmt_n(t['fps']):>9} "
            f"{fmt_x(t['vs_bare']):>7} {fmt_x(t['vs_torchrl']):>9} {fmt_n(t['first_s'], 2):>6} "
            f"{fmt_x(t['first_vs_import']):>7} {fmt_n(t['close_s'] * 1e3):>8} "
            f"{fmt_n(t['gone_s'] * 1e3):>8} {fmt_pct(t['trainer_cpu']):>7} "
            f"{fmt_n(t['trainer_ms_per_batch'], 1):>5} "
            f"{fmt_pct(t['nodes_cpu']):>6} {t['spread'] * 100:5.0f}% {t['ep_len']:6.1f}{fail}"
        )
    log("  fpb: frames per batch as the caller receives it. x bare / x TorchRL: frames/s over the")
    log("  bare loop's / TorchRL's class of the same role. 1st s: constructor call -> first batch;")
    log("  /floor: that over the fresh-process `import torch, gymnasium`. close ms: break ->")
    log("  shutdown() returned; gone ms: break -> every node process gone. trainer / nodes: CPU")
    log("  time of the trainer process / of both node processes over the steady window, per wall")
    log("  second (100% = one core); ms/b: the trainer's CPU milliseconds per batch. ep len:")
    log("  frames per episode end (rows collect alike).")

    log("\nRatios aiocollect / TorchRL (same role; frames/s above 1 is faster, times below 1 is")
    log("faster) and aiocollect / bare loop:")
    ratio_rows = [t for t in table if t["lib"] == "aiocollect"]
    for t in ratio_rows:
        log(
            f"  {t['workload']:<27} {t['row']:<44} frames/s {fmt_x(t['vs_torchrl']):>7} TorchRL, "
            f"{fmt_x(t['vs_bare']):>6} bare; first batch {fmt_x(t['first_vs_torchrl']):>6}; "
            f"nodes gone {fmt_x(t['gone_vs_torchrl']):>6}"
        )
    problems = [t for t in table if t["errors"] or t["leaks"] or t["exit_notes"]]
    if problems:
        log("\nFailures, leaks and hangs:")
        for t in problems:
            for e in t["errors"]:
                log(f"  {t['workload']}: {t['row']}: {e}")
            for leak in t["leaks"]:
                log(f"  {t['workload']}: {t['row']}: processes alive after shutdown: {leak}")
            for note in t["exit_notes"]:
                log(f"  {t['workload']}: {t['row']}: {note}")

    md = [
        "| workload | collector | fpb | frames/s | vs bare loop | vs TorchRL | first batch (s) "
        "| / import floor | close (ms) | nodes gone (ms) | trainer CPU "
        "| trainer CPU per batch (ms) | nodes CPU |",
        "| --- | --- |" + " ---: |" * 11,
    ]
    for t in table:
        if not t["ok"]:
            err = "; ".join(sorted(set(t["errors"])))[:160].replace("|", "/")
            md.append(f"| {t['workload']} | {t['row']} | {t['fpb']} | failed: {err} ||||||||||")
            continue
        trl_cell = fmt_x(t["vs_torchrl"]) if math.isfinite(t["vs_torchrl"]) else "-"
        is_bare = t["lib"] == "bare"
        md.append(
            f"| {t['workload']} | {t['row']} | {t['fpb']} | {fmt_n(t['fps'], sep=True)} "
            f"| {fmt_x(t['vs_bare'])} | {trl_cell} | {fmt_n(t['first_s'], 2)} "
            f"| {'-' if is_bare else fmt_x(t['first_vs_import'])} "
            f"| {'-' if is_bare else fmt_n(t['close_s'] * 1e3, sep=True)} "
            f"| {'-' if is_bare else fmt_n(t['gone_s'] * 1e3, sep=True)} "
            f"| {fmt_pct(t['trainer_cpu'])} | {fmt_n(t['trainer_ms_per_batch'], 1)} "
            f"| {'-' if is_bare else fmt_pct(t['nodes_cpu'])} |"
        )
    md += [
        "",
        (
            f"_Python {versions['python']}, torch {versions['torch']}, tensordict "
            f"{versions['tensordict']}, gymnasium {versions['gymnasium']}, torchrl "
            f"{versions['torchrl']}, aiocollect {versions['aiocollect']}; {os.cpu_count()} CPUs; "
            f"{NUM_NODES} nodes, launcher='mp', backend='gloo'; heavy step {burn_ms:.2f} ms; "
            f"median of {repeats} fresh process(es) per row; import floor `python -c "
            f'"{REFERENCE_CMD}"` = {ref:.2f} s (`{TD_REFERENCE_CMD}`: {td_ref:.2f} s)._'
        ),
    ]
    log("\nMarkdown:\n")
    log("\n".join(md))

    elapsed, load_end = time.perf_counter() - t_start, _loadavg()
    log(f"\ntotal time {elapsed:.1f} s; load average (1 min) {load_start:.2f} at start, {load_end:.2f} at end")
    if args.json:
        out = {
            "versions": versions,
            "settings": {
                "quick": quick,
                "repeats": repeats,
                "warmup_batches": warm,
                "num_nodes": NUM_NODES,
                "heavy_work": args.heavy_work,
                "heavy_step_ms": burn_ms,
                "workloads": {w: WORKLOADS[w] for w in workloads},
                "plan": plan,
            },
            "load_avg": [load_start, load_end],
            "reference_cmd": REFERENCE_CMD,
            "reference_s": ref,
            "reference_runs_s": ref_runs,
            "td_reference_cmd": TD_REFERENCE_CMD,
            "td_reference_s": td_ref,
            "td_reference_runs_s": td_ref_runs,
            "rows": table,
            "elapsed_s": elapsed,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, default=str)
    return 0


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return float("nan")


def _dist_version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "not installed"


if __name__ == "__main__":  # the guard matters: node processes re-import this module
    sys.exit(main())
