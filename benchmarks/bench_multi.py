#!/usr/bin/env python
"""Multi-process collectors side by side: throughput, first batch, parent CPU, event-loop gaps.

Compares, in ONE run and on the same workloads (env + 64-64 MLP policy, 2 workers):

* the single-process bare loop of ``bench_collect.py`` (the reference, ratio 1.00),
* gymnasium's ``AsyncVectorEnv`` driven by the same hand-written loop,
* aiocollect's ``MultiSyncCollector``, ``MultiAsyncCollector`` and ``AsyncCollector`` (their
  blocking twins in a plain ``for`` loop), and the async ``MultiSyncCollector`` under
  ``anyio.run`` with a 1 ms heartbeat task on the same event loop,
* TorchRL's ``MultiSyncCollector``, ``MultiAsyncCollector`` and ``AsyncCollector`` (skipped
  with a note if torchrl is missing).

Workloads: CartPole-v1 as a gymnasium SyncVectorEnv of 8 per worker, and a "heavy"
CartPole-like env (``HeavyEnv`` below) whose step burns about 1 ms of CPU, 1 env per worker.
For every row it prints frames/s (median of N repeats after a warmup), the ratio to the bare
loop and to TorchRL's counterpart, the time from construction to the first batch (warm median
and cold), the time to shut down, and the parent process's CPU use while it waits for batches.
The output ends with a Markdown table and PASS/FAIL lines against the project's targets.

Usage::

    python benchmarks/bench_multi.py            # full run (about 7 min on 2 idle cores)
    python benchmarks/bench_multi.py --quick    # CI smoke (about 1 min on 2 idle cores)

See benchmarks/README.md for what each row means and the fairness rules.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import math
import multiprocessing
import os
import platform
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import torch
from gymnasium.envs.classic_control.cartpole import CartPoleEnv
from gymnasium.wrappers import TimeLimit
from torch import nn

import aiocollect

# The single-process benchmark's helpers (policy, bare loop, formatting). Spawned workers
# re-import this module, and with it this path setup, so they can import it too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_collect as bc

NUM_WORKERS = 2
CARTPOLE_ENVS = 8  # per worker
HEAVY_WORK = 8000  # iterations of _burn per HeavyEnv step: about 1 ms on a quiet 2-core VM
TARGETS = {
    "heavy_vs_bare": 1.8,  # 2 workers on the heavy env vs the single-process bare loop
    "torchrl_ratio": 3.0,  # MultiSync / MultiAsync vs TorchRL's counterparts, CartPole x8
    "first_batch_ms": 1500.0,  # every aiocollect process-based row (warm median)
    "heartbeat_p99_ms": 5.0,  # the async MultiSync's event loop, construction to teardown
}
SAME_STEP, DISABLED = bc.SAME_STEP, bc.DISABLED

# --------------------------------------------------------------------------------------------
# Workloads. Everything a worker process needs is module level (picklable for spawn).
# --------------------------------------------------------------------------------------------


def _burn(n: int) -> int:
    """Deterministic pure-Python CPU work (a Lehmer RNG): the same cost in every process."""
    x = 1
    for _ in range(n):
        x = (x * 48271) % 2147483647
    return x


class HeavyEnv(CartPoleEnv):
    """CartPole (4 float32 obs, 2 actions, same dynamics) whose step also burns ``work``
    iterations of pure-Python arithmetic, about 1 ms of CPU for the default ``HEAVY_WORK``.
    The work holds the GIL, like a Python simulator would."""

    def __init__(self, work: int = HEAVY_WORK) -> None:
        super().__init__()
        self.work = work
        self.sink = 0

    def step(self, action: Any) -> Any:
        out = super().step(action)
        self.sink = _burn(self.work)
        return out


def make_heavy(work: int = HEAVY_WORK) -> gym.Env:
    return TimeLimit(HeavyEnv(work), max_episode_steps=500)  # CartPole-v1's limit


def make_cartpole8() -> gym.vector.VectorEnv:
    """bench_collect's CartPole x8 (``vec_fn``): SyncVectorEnv of 8, SAME_STEP autoreset."""
    return gym.make_vec(
        "CartPole-v1",
        CARTPOLE_ENVS,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": SAME_STEP},
    )


# AsyncVectorEnv's start method, fixed at import: importing torchrl switches the process-wide
# default to spawn, and 16 spawned interpreters that each import torch take most of a minute
# to start on 2 cores. fork is what a plain script on Linux gets (Python < 3.14).
ASYNC_VEC_CONTEXT = "fork" if "fork" in multiprocessing.get_all_start_methods() else multiprocessing.get_start_method()


def make_async_vec(env_fn: Callable[[], gym.Env], n: int) -> gym.vector.VectorEnv:
    """gymnasium's AsyncVectorEnv: one process per env, shared-memory observations, SAME_STEP
    autoreset so the bare loop records real transitions (terminal obs from ``final_obs``)."""
    return gym.vector.AsyncVectorEnv(
        [env_fn] * n, shared_memory=True, context=ASYNC_VEC_CONTEXT, autoreset_mode=SAME_STEP
    )


def trl_cartpole8() -> Any:
    """TorchRL's fastest setup for this vector env (see bench_collect): its GymWrapper around
    the same SyncVectorEnv of 8, in AutoresetMode.DISABLED."""
    from torchrl.envs import GymWrapper

    env = gym.make_vec(
        "CartPole-v1",
        CARTPOLE_ENVS,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": DISABLED},
    )
    return GymWrapper(env, categorical_action_encoding=True)


def trl_heavy(work: int = HEAVY_WORK) -> Any:
    from torchrl.envs import GymWrapper

    return GymWrapper(make_heavy(work), categorical_action_encoding=True)


@dataclass
class Workload:
    key: str
    title: str
    env_fn: Callable[[], Any]  # one worker's env: the bare loop and aiocollect's workers
    async_vec_fn: Callable[[], Any]  # all workers' envs as one gymnasium AsyncVectorEnv
    async_vec_label: str
    async_vec_procs: int
    trl_env_fn: Callable[[], Any]
    fpb: int  # frames per batch of ONE worker
    policy: nn.Module


def make_workloads(work: int) -> list[Workload]:
    torch.manual_seed(0)  # same MLP weights on every run
    heavy = functools.partial(make_heavy, work)
    n_cp = NUM_WORKERS * CARTPOLE_ENVS
    return [
        Workload(
            "cartpole8",
            f"CartPole-v1 x{CARTPOLE_ENVS}/worker",
            make_cartpole8,
            functools.partial(make_async_vec, functools.partial(gym.make, "CartPole-v1"), n_cp),
            f"gymnasium AsyncVectorEnv({n_cp} envs)",
            n_cp,
            trl_cartpole8,
            800,
            bc.DiscretePolicy(4, 2),
        ),
        Workload(
            "heavy",
            "Heavy (~1 ms/step) x1/worker",
            heavy,
            functools.partial(make_async_vec, heavy, NUM_WORKERS),
            f"gymnasium AsyncVectorEnv({NUM_WORKERS} envs)",
            NUM_WORKERS,
            functools.partial(trl_heavy, work),
            100,
            bc.DiscretePolicy(4, 2),
        ),
    ]


# --------------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------------


@dataclass
class Run:
    first_s: float  # construction (or env factory call) -> first batch in hand
    fps: float  # steady state: frames after the first batch / (last batch - first batch)
    frames: int
    dones: int
    cpu_util: float  # parent process CPU seconds (all threads) / wall seconds, steady state
    close_s: float  # last batch in hand -> the collector / env shut down
    leaked: list[str] = field(default_factory=list)
    gaps: list[tuple[float, float]] = field(default_factory=list)  # (phase, gap s), async row


def _batch_frames(batch: Any) -> int:
    return batch.numel() if hasattr(batch, "numel") else batch["reward"].numel()


def measure_iter(make: Callable[[], Iterator[Any]]) -> Run:
    """bench_collect.measure_iter, plus parent CPU use and shutdown time. The clock starts
    before the generator is created; its first ``next`` constructs the collector."""
    gc.collect()
    t0 = time.perf_counter()
    it = make()
    t_first = t_last = c_first = c_last = 0.0
    frames = first_frames = dones = 0
    for i, batch in enumerate(it):
        t_last, c_last = time.perf_counter(), time.process_time()
        n = _batch_frames(batch)
        frames += n
        dones += bc._count_dones(batch)
        if i == 0:
            t_first, c_first, first_frames = t_last, c_last, n
    t_end = time.perf_counter()  # the for loop ran the generator's shutdown code
    wall = t_last - t_first
    return Run(
        t_first - t0,
        bc._fps(t_first, t_last, frames - first_frames),
        frames,
        dones,
        (c_last - c_first) / wall if wall > 0 else math.nan,
        t_end - t_last,
    )


def bare_iter(env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int) -> Iterator[Any]:
    # bench_collect's hand-written loop; it closes the env (and AsyncVectorEnv's workers).
    return bc.bare_loop(env_fn, policy, fpb, total, same_step=True)


def aio_iter(
    cls: type, env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int, workers: int
) -> Iterator[Any]:
    kw: dict[str, Any] = {"frames_per_batch": fpb, "total_frames": total}
    if workers:
        kw["num_workers"] = workers
    with cls(env_fn, policy, **kw) as c:
        yield from c


async def _aio_async_run(env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int, workers: int) -> Run:
    """The async MultiSyncCollector under anyio.run, with a 1 ms heartbeat task running from
    just before construction to the end of the ``async with`` block (teardown included)."""
    stamps: list[float] = []
    done = False

    async def beat() -> None:
        while not done:
            await anyio.sleep(0.001)
            stamps.append(time.perf_counter())

    async with anyio.create_task_group() as tg:
        tg.start_soon(beat)
        await anyio.sleep(0.01)  # let the heartbeat settle before construction starts
        t0 = time.perf_counter()
        t_first = t_last = c_first = c_last = 0.0
        frames = first_frames = dones = 0
        async with aiocollect.MultiSyncCollector(
            env_fn, policy, num_workers=workers, frames_per_batch=fpb, total_frames=total
        ) as c:
            async for batch in c:
                t_last, c_last = time.perf_counter(), time.process_time()
                if not frames:
                    t_first, c_first, first_frames = t_last, c_last, batch.numel()
                frames += batch.numel()
                dones += bc._count_dones(batch)
        t_end = time.perf_counter()
        done = True
    # Gaps between wakeups from t0 on, tagged by phase: 0 startup, 1 steady, 2 teardown.
    gaps = []
    prev = None
    for s in stamps:
        if prev is not None and s > t0:
            phase = 0 if s <= t_first else 1 if s <= t_last else 2
            gaps.append((phase, s - prev))
        prev = s
    wall = t_last - t_first
    return Run(
        t_first - t0,
        bc._fps(t_first, t_last, frames - first_frames),
        frames,
        dones,
        (c_last - c_first) / wall if wall > 0 else math.nan,
        t_end - t_last,
        gaps=gaps,
    )


def measure_async(env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int) -> Run:
    gc.collect()

    async def main() -> Run:
        return await _aio_async_run(env_fn, policy, fpb, total, NUM_WORKERS)

    return anyio.run(main, backend="asyncio")


# --------------------------------------------------------------------------------------------
# TorchRL
# --------------------------------------------------------------------------------------------

_TRL_NAMES = {  # 0.14 names first, then the legacy ones
    "MultiSync": ("MultiSyncCollector", "MultiSyncDataCollector"),
    "MultiAsync": ("MultiAsyncCollector", "MultiaSyncDataCollector"),
    "Async": ("AsyncCollector", "aSyncDataCollector"),
}


def torchrl_missing() -> str | None:
    """Why TorchRL rows cannot run, or None. Does not import torchrl: importing it changes the
    process-wide multiprocessing start method, which would affect the other rows."""
    import importlib.util

    return None if importlib.util.find_spec("torchrl") is not None else "torchrl is not installed"


def torchrl_classes() -> tuple[dict[str, tuple[type, str]], str | None]:
    """TorchRL's multi-process collector classes by role, or ({}, reason) if unavailable."""
    try:
        import torchrl.collectors as trc
    except Exception as exc:
        return {}, f"{type(exc).__name__}: {exc}"
    out = {}
    for role, names in _TRL_NAMES.items():
        for name in names:
            if hasattr(trc, name):
                out[role] = (getattr(trc, name), f"torchrl.collectors.{name}")
                break
    return out, None if out else "no multi-process collector class found in torchrl.collectors"


def torchrl_iter(
    cls: type, env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int, workers: int
) -> Iterator[Any]:
    from tensordict.nn import TensorDictModule

    module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
    if workers:
        c = cls([env_fn] * workers, module, frames_per_batch=fpb, total_frames=total)
    else:
        c = cls(env_fn, module, frames_per_batch=fpb, total_frames=total)
    try:
        yield from c
    finally:
        c.shutdown()


# --------------------------------------------------------------------------------------------
# Child processes: every row must leave none behind
# --------------------------------------------------------------------------------------------

_HELPERS = ("resource_tracker", "forkserver", "torch_shm_manager", "semaphore_tracker")


def live_children() -> tuple[list[str], list[str]]:
    """(worker-like children still alive, long-lived multiprocessing/torch helpers)."""
    found: dict[int, str] = {}
    for p in multiprocessing.active_children():  # also reaps finished ones
        found[p.pid] = f"{p.pid} {p.name}"
    try:
        import psutil
    except ImportError:
        psutil = None  # type: ignore[assignment]
    helper_pids: set[int] = set()
    if psutil is not None:
        me = os.getpid()
        for p in psutil.Process().children(recursive=True):
            try:
                if p.status() == psutil.STATUS_ZOMBIE:
                    found.setdefault(p.pid, f"{p.pid} <zombie>")
                    continue
                cmd = " ".join(p.cmdline())
                ppid = p.ppid()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            found.setdefault(p.pid, f"{p.pid} {cmd[:80]}")
            # A helper is our direct child; processes forked by a forkserver share its
            # command line but are workers.
            if ppid == me and any(h in cmd for h in _HELPERS):
                helper_pids.add(p.pid)
    else:
        helper_pids = {pid for pid, d in found.items() if any(h in d for h in _HELPERS)}
    workers = [d for pid, d in found.items() if pid not in helper_pids]
    helpers = [d for pid, d in found.items() if pid in helper_pids]
    return workers, helpers


def wait_children_gone(timeout: float = 3.0) -> list[str]:
    deadline = time.perf_counter() + timeout
    while True:
        left, _ = live_children()
        if not left or time.perf_counter() > deadline:
            return left
        time.sleep(0.05)


# --------------------------------------------------------------------------------------------
# Harness
# --------------------------------------------------------------------------------------------


@dataclass
class Row:
    workload: str
    name: str
    kind: str  # "bare" | "gym" | "aio" | "aio_async" | "torchrl"
    role: str | None  # "MultiSync" | "MultiAsync" | "Async": pairs aiocollect with TorchRL
    workers: int  # env processes (0: everything in this process)
    fpb: int  # frames per batch as the caller sees it
    runner: Callable[[int], Run]  # total_frames -> Run
    runs: list[Run] = field(default_factory=list)
    cold: Run | None = None
    total: int = 0
    leaks: list[str] = field(default_factory=list)

    @staticmethod
    def _median(values: Any) -> float:
        v = [x for x in values if math.isfinite(x)]
        return statistics.median(v) if v else float("nan")

    @property
    def fps(self) -> float:
        return self._median(r.fps for r in self.runs)

    @property
    def first_ms(self) -> float:
        return self._median(r.first_s * 1e3 for r in self.runs)

    @property
    def cold_ms(self) -> float:
        return self.cold.first_s * 1e3 if self.cold else float("nan")

    @property
    def close_ms(self) -> float:
        return self._median(r.close_s * 1e3 for r in self.runs)

    @property
    def cpu(self) -> float:
        return self._median(r.cpu_util for r in self.runs)

    @property
    def ep_len(self) -> float:
        frames, dones = sum(r.frames for r in self.runs), sum(r.dones for r in self.runs)
        return frames / dones if dones else float("inf")

    @property
    def spread(self) -> float:
        f = [r.fps for r in self.runs if math.isfinite(r.fps)]
        return (max(f) - min(f)) / statistics.median(f) if len(f) > 1 else 0.0


@dataclass
class Settings:
    repeats: int
    target_s: float  # approximate steady-state length of one timed run
    min_batches: int  # per timed run; the first batch is not part of frames/s
    warm_batches: int  # 0: no warmup run (--quick): runs have min_batches, cold = first run
    max_batches: int = 400


def _run_once(row: Row, total: int, log: Callable[[str], None]) -> Run:
    r = row.runner(total)
    left = wait_children_gone()
    if left:
        r.leaked = left
        row.leaks += left
        log(f"  WARNING: {row.name}: {len(left)} child process(es) alive after shutdown: {left}")
    return r


def run_rows(rows: list[Row], st: Settings, log: Callable[[str], None]) -> None:
    """bench_collect.run_rows with per-row batch sizes: warm up every row (recording its cold
    first batch and sizing its runs), then time them round robin."""
    for row in rows:
        if not st.warm_batches:  # --quick: every process start costs seconds; skip the warmup
            row.total = st.min_batches * row.fpb
            continue
        warm = _run_once(row, st.warm_batches * row.fpb, log)
        row.cold = warm
        fps = warm.fps if math.isfinite(warm.fps) else row.fpb / warm.first_s
        n = round(st.target_s * fps / row.fpb) + 1
        row.total = max(st.min_batches, min(st.max_batches, n)) * row.fpb
        log(
            f"  warmup  {row.workload:<9} {row.name:<46} cold first batch "
            f"{row.cold_ms:6.0f} ms, {row.total // row.fpb} batches/run"
        )
    for rep in range(st.repeats):
        for row in rows:
            r = _run_once(row, row.total, log)
            row.runs.append(r)
            row.cold = row.cold or r
            log(
                f"  run {rep + 1}/{st.repeats} {row.workload:<9} {row.name:<46} "
                f"{r.fps:8.0f} frames/s  first {r.first_s * 1e3:5.0f} ms  "
                f"close {r.close_s * 1e3:5.0f} ms  parent CPU {r.cpu_util * 100:4.0f}%"
            )


def build_rows(w: Workload, forkserver: bool, quick: bool) -> list[Row]:
    """Bare loop, AsyncVectorEnv loop and aiocollect rows of one workload."""
    n, fpb, pol = NUM_WORKERS, w.fpb, w.policy

    def it(make: Callable[[int], Iterator[Any]]) -> Callable[[int], Run]:
        return lambda total: measure_iter(lambda: make(total))

    def aio(cls: Any, fpb: int, workers: int) -> Callable[[int], Run]:
        return it(lambda t: aio_iter(cls, w.env_fn, pol, fpb, t, workers))

    extra = []
    if forkserver:
        # Informational: workers forked from a forkserver (aiocollect sets its preload list so
        # that the server imports torch & co. once) instead of spawned interpreters that import
        # them again (aiocollect's default start method).
        fs = functools.partial(aiocollect.MultiSyncDataCollector, start_method="forkserver")
        extra.append(
            Row(w.key, "aiocollect MultiSyncDataCollector (forkserver)", "aio_extra", None, n,
                n * fpb, aio(fs, n * fpb, n))
        )  # fmt: skip
    return [
        Row(w.key, "bare loop (1 process)", "bare", None, 0, fpb,
            it(lambda t: bare_iter(w.env_fn, pol, fpb, t))),
        Row(w.key, w.async_vec_label + " + loop", "gym", None, w.async_vec_procs, n * fpb,
            it(lambda t: bare_iter(w.async_vec_fn, pol, n * fpb, t))),
        Row(w.key, "aiocollect MultiSyncDataCollector", "aio", "MultiSync", n, n * fpb,
            aio(aiocollect.MultiSyncDataCollector, n * fpb, n)),
        Row(w.key, "aiocollect MultiaSyncDataCollector", "aio", "MultiAsync", n, fpb,
            aio(aiocollect.MultiaSyncDataCollector, fpb, n)),
    ] + ([] if quick and w.key == "heavy" else [  # --quick: AsyncCollector on CartPole only
        Row(w.key, "aiocollect aSyncDataCollector", "aio", "Async", 1, fpb,
            aio(aiocollect.aSyncDataCollector, fpb, 0)),
    ]) + [
        Row(w.key, "aiocollect MultiSyncCollector (async)", "aio_async", "MultiSync", n, n * fpb,
            lambda t: measure_async(w.env_fn, pol, n * fpb, t)),
    ] + extra  # fmt: skip


def build_torchrl_rows(w: Workload, classes: dict[str, tuple[type, str]], roles: list[str]) -> list[Row]:
    rows = []
    for role in roles:
        if role not in classes:
            continue
        cls, full = classes[role]
        workers = 0 if role == "Async" else NUM_WORKERS
        fpb = NUM_WORKERS * w.fpb if role == "MultiSync" else w.fpb

        def runner(t: int, cls: type = cls, workers: int = workers, fpb: int = fpb) -> Run:
            return measure_iter(lambda: torchrl_iter(cls, w.trl_env_fn, w.policy, fpb, t, workers))

        name = "TorchRL " + full.rsplit(".", 1)[-1]
        rows.append(Row(w.key, name, "torchrl", role, workers or 1, fpb, runner))
    return rows


def heartbeat_summary(row: Row) -> dict[str, float]:
    gaps = [(p, g) for r in row.runs for p, g in r.gaps]
    if not gaps:
        return {}
    ms = np.asarray([g for _, g in gaps]) * 1e3
    out = {
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "max_ms": float(ms.max()),
        "ticks": len(gaps),
    }
    for phase, label in enumerate(("startup", "steady", "teardown")):
        sel = np.asarray([g for p, g in gaps if p == phase]) * 1e3
        out[f"{label}_p99_ms"] = float(np.percentile(sel, 99)) if sel.size else math.nan
        out[f"{label}_max_ms"] = float(sel.max()) if sel.size else math.nan
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="See benchmarks/README.md for what each row means.",
    )
    ap.add_argument("--quick", action="store_true", help="short CI smoke run (about 1 min), noisy")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per row (default 3; 1 with --quick)")
    ap.add_argument(
        "--target-seconds",
        type=float,
        default=None,
        help="approximate steady-state length of one timed run (default 1.0; 0.3 with --quick)",
    )
    ap.add_argument(
        "--workload",
        action="append",
        choices=["cartpole8", "heavy"],
        help="run only this workload (repeatable)",
    )
    ap.add_argument(
        "--heavy-work",
        type=int,
        default=HEAVY_WORK,
        help=f"iterations of pure-Python work per heavy step (default {HEAVY_WORK}, ~1 ms)",
    )
    ap.add_argument("--no-torchrl", action="store_true", help="skip the TorchRL rows")
    ap.add_argument(
        "--torchrl-start-method",
        choices=["spawn", "fork", "forkserver"],
        default="spawn",
        help="multiprocessing start method for the TorchRL rows (default spawn, what `import "
        "torchrl` selects on Linux in a fresh process)",
    )
    ap.add_argument(
        "--no-forkserver-row",
        dest="forkserver_row",
        action="store_false",
        help="skip the informational MultiSync start_method='forkserver' row (full run, CartPole)",
    )
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 if a target FAILs")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    st = Settings(
        repeats=args.repeats or (1 if quick else 3),
        target_s=args.target_seconds or (0.3 if quick else 1.0),
        min_batches=5 if quick else 3,
        warm_batches=0 if quick else 3,
    )
    args.forkserver_row = args.forkserver_row and not quick
    t_start, load_start = time.perf_counter(), bc._loadavg()
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")

    def log(msg: str = "") -> None:
        print(msg, flush=True)

    trl_missing = "disabled with --no-torchrl" if args.no_torchrl else torchrl_missing()
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensordict": bc._dist_version("tensordict"),
        "gymnasium": gym.__version__,
        "anyio": bc._dist_version("anyio"),
        "torchrl": bc._dist_version("torchrl") if trl_missing is None else "not used",
        "aiocollect": aiocollect.__version__,
    }
    mode = "QUICK (AsyncCollector and TorchRL MultiSync on CartPole only)" if quick else "full"
    after = "after a warmup" if st.warm_batches else "(no warmup run: cold = warm)"
    log(
        f"bench_multi: {mode} run, {st.repeats} timed runs/row {after}, "
        f"~{st.target_s:g} s of steady state each, {NUM_WORKERS} workers"
    )
    log(
        f"  {platform.platform()}, {os.cpu_count()} CPUs, torch threads={torch.get_num_threads()}, "
        f"AsyncVectorEnv start method={ASYNC_VEC_CONTEXT}"
    )
    log("  " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if trl_missing is not None:
        log(f"  NOTE: TorchRL rows skipped ({trl_missing})")
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
    pre_children, _ = live_children()
    if pre_children:
        log(f"  NOTE: child processes alive before the benchmark: {pre_children}")

    workloads = [w for w in make_workloads(args.heavy_work) if not args.workload or w.key in args.workload]
    titles = {w.key: w.title for w in workloads}
    rows: list[Row] = []

    phase = time.perf_counter()
    log("\n[1/2] bare loop, gymnasium AsyncVectorEnv and aiocollect (round robin per workload)")
    for w in workloads:
        wrows = build_rows(w, args.forkserver_row and w.key == "cartpole8", quick)
        run_rows(wrows, st, log)
        rows += wrows
    log(f"  ({time.perf_counter() - phase:.1f} s)")

    if trl_missing is None:
        # Last, so that importing and running TorchRL cannot disturb the other rows.
        phase = time.perf_counter()
        logging.getLogger("torchrl").setLevel(logging.WARNING)  # silence its INFO chatter
        classes, trl_missing = torchrl_classes()
    if trl_missing is not None:
        log(f"\n[2/2] TorchRL rows skipped ({trl_missing})")
    else:
        # `import torchrl` sets the process-wide start method to spawn, but only if nothing
        # fixed it before, and every spawn-context Process.start() (aiocollect's workers) fixes
        # it to the platform default (fork on Linux). Restore what TorchRL would get in a fresh
        # script, so its rows do not silently run with fork.
        before = multiprocessing.get_start_method(allow_none=True)
        multiprocessing.set_start_method(args.torchrl_start_method, force=True)
        log(
            "\n[2/2] TorchRL (" + ", ".join(full for _, full in classes.values()) + "), "
            f"start method {args.torchrl_start_method} (was {before})"
        )
        for w in workloads:
            roles = list(_TRL_NAMES)
            if quick:  # TorchRL's process start alone takes seconds: keep the smallest check
                roles = ["MultiSync"] if w.key == "cartpole8" else []
            trows = build_torchrl_rows(w, classes, roles)
            run_rows(trows, st, log)
            rows += trows
        log(f"  ({time.perf_counter() - phase:.1f} s)")

    # ------------------------------------------------------------------------------ results
    by_wl = {w.key: [r for r in rows if r.workload == w.key] for w in workloads}

    def find(wl: str, kind: str, role: str | None = None) -> Row | None:
        return next(
            (r for r in by_wl.get(wl, []) if r.kind == kind and (role is None or r.role == role)),
            None,
        )

    table: list[dict[str, Any]] = []
    for w in workloads:
        bare = find(w.key, "bare")
        for r in by_wl[w.key]:
            trl = find(w.key, "torchrl", r.role) if r.role and r.kind.startswith("aio") else None
            table.append(
                {
                    "workload": titles[w.key],
                    "row": r.name,
                    "kind": r.kind,
                    "env_procs": r.workers,
                    "frames_per_batch": r.fpb,
                    "fps": r.fps,
                    "vs_bare": r.fps / bare.fps if bare else math.nan,
                    "vs_torchrl": r.fps / trl.fps if trl else math.nan,
                    "vs_torchrl_row": trl.name if trl else None,
                    "first_ms": r.first_ms,
                    "cold_first_ms": r.cold_ms,
                    "close_ms": r.close_ms,
                    "parent_cpu": r.cpu,
                    "spread": r.spread,
                    "ep_len": r.ep_len,
                    "frames_per_run": r.total,
                    "runs_fps": [x.fps for x in r.runs],
                    "runs_first_ms": [x.first_s * 1e3 for x in r.runs],
                    "leaked": r.leaks,
                }
            )
    heart = {titles[r.workload]: heartbeat_summary(r) for r in rows if r.kind == "aio_async"}
    heart = {k: v for k, v in heart.items() if v}
    if heart:
        c0, t0 = time.process_time(), time.perf_counter()
        idle = np.asarray(anyio.run(bc._idle_heartbeat, 1.0)) * 1e3
        idle_cpu = (time.process_time() - c0) / (time.perf_counter() - t0)
        heart["idle loop (reference)"] = {
            "p50_ms": float(np.percentile(idle, 50)),
            "p99_ms": float(np.percentile(idle, 99)),
            "max_ms": float(idle.max()),
            "ticks": int(idle.size),
            "cpu": idle_cpu,  # the heartbeat's own cost, included in the async row's parent CPU
        }

    # Targets.
    checks: list[tuple[str, bool | None, str]] = []
    heavy_bare = find("heavy", "bare")
    if heavy_bare is not None:
        for r in by_wl["heavy"]:
            if r.kind in ("aio", "aio_async") and r.workers == NUM_WORKERS:
                x = r.fps / heavy_bare.fps
                checks.append(
                    (
                        f"Heavy: {r.name} ({NUM_WORKERS} workers) >= "
                        f"{TARGETS['heavy_vs_bare']}x single-process bare loop",
                        x >= TARGETS["heavy_vs_bare"],
                        f"{x:.2f}x ({r.fps:.0f} vs {heavy_bare.fps:.0f} frames/s)",
                    )
                )
    for r in by_wl.get("cartpole8", []):
        if r.kind in ("aio", "aio_async") and r.role in ("MultiSync", "MultiAsync"):
            desc = f"CartPole x8: {r.name} >= {TARGETS['torchrl_ratio']:g}x TorchRL {r.role}"
            trl = find("cartpole8", "torchrl", r.role)
            if trl is None:
                checks.append((desc, None, "TorchRL counterpart not run"))
            else:
                x = r.fps / trl.fps
                val = f"{x:.2f}x ({r.fps:.0f} vs {trl.fps:.0f} frames/s)"
                checks.append((desc, x >= TARGETS["torchrl_ratio"], val))
    limit = TARGETS["first_batch_ms"]
    for r in rows:
        if r.kind in ("aio", "aio_async"):
            desc = f"{titles[r.workload]}: {r.name} first batch < {limit:.0f} ms"
            val = f"{r.first_ms:.0f} ms (cold {r.cold_ms:.0f} ms)"
            checks.append((desc, r.first_ms < limit, val))
    for label, v in heart.items():
        if label.startswith("idle"):
            continue
        lim = TARGETS["heartbeat_p99_ms"]
        checks.append(
            (
                f"{label}: async MultiSyncCollector event-loop heartbeat p99 <= {lim:g} ms",
                v["p99_ms"] <= lim,
                f"p99 {v['p99_ms']:.2f} ms, max {v['max_ms']:.1f} ms",
            )
        )

    # Leftover processes after everything was shut down.
    gc.collect()
    left = wait_children_gone(5.0)
    _, helpers = live_children()
    leaked_rows = [r.name + f" ({titles[r.workload]})" for r in rows if r.leaks]
    clean = not left and not leaked_rows
    checks.append(
        (
            "no worker process left alive after shutdown",
            clean,
            "none" if clean else f"alive now: {left}; rows that leaked: {leaked_rows}",
        )
    )

    log("\n" + "=" * 120)
    log(
        f"RESULTS: frames/s = median of {st.repeats} timed runs {after} (steady state, "
        "first batch excluded); 1st ms = median time from construction to the first batch"
    )
    hdr = (
        f"{'workload':<29} {'row':<46} {'procs':>5} {'fpb':>5} {'frames/s':>9} {'x bare':>7} "
        f"{'x TorchRL':>9} {'1st ms':>7} {'cold ms':>8} {'close ms':>8} {'parent CPU':>10} "
        f"{'spread':>7} {'ep len':>7}"
    )
    log(hdr)
    log("-" * len(hdr))
    for t in table:
        log(
            f"{t['workload']:<29} {t['row']:<46} {t['env_procs']:>5} {t['frames_per_batch']:>5} "
            f"{t['fps']:9.0f} {bc.fmt_ratio(t['vs_bare']):>7} {bc.fmt_ratio(t['vs_torchrl']):>9} "
            f"{t['first_ms']:7.0f} {t['cold_first_ms']:8.0f} {t['close_ms']:8.0f} "
            f"{t['parent_cpu'] * 100:9.0f}% {t['spread'] * 100:6.1f}% {t['ep_len']:7.1f}"
        )
    log("  procs: env processes (0 = all in this process). fpb: frames per batch as the caller")
    log("  sees it. x TorchRL: vs TorchRL's class of the same role (MultiSync/MultiAsync/Async).")
    log("  cold ms: first batch of the row's first construction in this process. close ms: last")
    log("  batch -> shut down. parent CPU: this process's CPU time (all threads) / wall time while")
    log("  batches arrive (100% = one core). ep len: frames per episode end (rows collect alike).")

    if heart:
        log(
            "\nEvent-loop responsiveness: gap between wakeups of a task doing "
            "'await anyio.sleep(0.001)'\non the loop of the async MultiSyncCollector, from "
            "construction to the end of teardown"
        )
        for label, v in heart.items():
            phases = ""
            if "steady_max_ms" in v:
                phases = (
                    f"\n  {'':<29} steady state only: p99 {v['steady_p99_ms']:.2f} ms; max gap by "
                    f"phase: startup {v['startup_max_ms']:.1f}, steady {v['steady_max_ms']:.1f}, "
                    f"teardown {v['teardown_max_ms']:.1f} ms"
                )
            if "cpu" in v:
                phases = f", the heartbeat alone uses {v['cpu'] * 100:.0f}% CPU"
            log(
                f"  {label:<29} p50 {v['p50_ms']:6.2f} ms  p99 {v['p99_ms']:6.2f} ms  "
                f"max {v['max_ms']:7.2f} ms  ({v['ticks']} ticks){phases}"
            )

    log("\nTargets:")
    any_fail = False
    for desc, ok, val in checks:
        any_fail |= ok is False
        log(f"  [{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}] {desc}: {val}")
    if left:
        log(f"  WARNING: child processes still alive at exit: {left}")
    if helpers:
        log(f"  (long-lived multiprocessing helpers, not counted as leaks: {helpers})")

    md = [
        "| workload | collector | env procs | frames/s | vs bare loop | vs TorchRL | "
        "first batch (ms) | cold first batch (ms) | parent CPU |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for t in table:
        trl_cell = bc.fmt_ratio(t["vs_torchrl"]) if math.isfinite(t["vs_torchrl"]) else "-"
        md.append(
            f"| {t['workload']} | {t['row']} | {t['env_procs']} | {t['fps']:,.0f} "
            f"| {bc.fmt_ratio(t['vs_bare'])} | {trl_cell} | {t['first_ms']:,.0f} "
            f"| {t['cold_first_ms']:,.0f} | {t['parent_cpu'] * 100:.0f}% |"
        )
    if heart:
        md += [
            "",
            "| event loop of the async MultiSyncCollector | p50 gap (ms) | p99 gap (ms) | max gap (ms) |",
            "| --- | ---: | ---: | ---: |",
        ]
        md += [f"| {k} | {v['p50_ms']:.2f} | {v['p99_ms']:.2f} | {v['max_ms']:.2f} |" for k, v in heart.items()]
    md += [
        "",
        (
            f"_Python {versions['python']}, torch {versions['torch']}, tensordict "
            f"{versions['tensordict']}, gymnasium {versions['gymnasium']}, "
            f"torchrl {versions['torchrl']}, aiocollect {versions['aiocollect']}; "
            f"{os.cpu_count()} CPUs, {NUM_WORKERS} workers, torch.set_num_threads(1); heavy step "
            f"{burn_ms:.2f} ms; frames/s is the median of {st.repeats} timed runs {after}; "
            "first batch is the time from construction to the first batch in hand._"
        ),
    ]
    log("\nMarkdown:\n")
    log("\n".join(md))

    elapsed, load_end = time.perf_counter() - t_start, bc._loadavg()
    log(
        f"\ntotal time {elapsed:.1f} s; load average (1 min) {load_start:.2f} at start, "
        f"{load_end:.2f} at end (this benchmark adds about 2)"
    )
    if args.json:
        result = {
            "versions": versions,
            "settings": {
                "quick": quick,
                "repeats": st.repeats,
                "target_seconds": st.target_s,
                "num_workers": NUM_WORKERS,
                "heavy_work": args.heavy_work,
                "heavy_step_ms": burn_ms,
                "async_vector_env_start_method": ASYNC_VEC_CONTEXT,
                "torchrl_start_method": args.torchrl_start_method,
            },
            "load_avg": [load_start, load_end],
            "rows": table,
            "heartbeat": heart,
            "checks": [{"check": d, "ok": ok, "value": v} for d, ok, v in checks],
            "children_left": left,
            "elapsed_s": elapsed,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 1 if args.strict and any_fail else 0


if __name__ == "__main__":  # the guard matters: spawned workers re-import this module
    sys.exit(main())
