#!/usr/bin/env python
"""Coroutine envs: aiocollect's AsyncEnvPool beside a bare asyncio loop, a thread pool and gymnasium.

Workload: single envs whose step waits ``delay`` seconds (a remote simulator, a web API),
then returns a 1-float observation; a random policy (``policy=None``); lock-step batches.
Rows, for each (number of envs, delay) case:

* ``aiocollect <loop>``: ``Collector(lambda: AsyncEnvPool([...]))`` under asyncio, uvloop and
  trio, ``frames_per_batch`` = 16 steps of every env; frames/s over the batches after the first
  (each row is the median of ``--rounds`` runs, the rows of a case interleaved);
* ``aiocollect uvloop, barrier-free`` (and ``trio, barrier-free``): the same with
  ``AsyncEnvPool(min_ready=n // 4)``: envs step independently (flat batches of the same number
  of frames);
* ``bare asyncio loop``: a hand-written loop (``asyncio.gather`` of every env's step, random
  actions, results written into a preallocated array), the floor any collector adds to;
* ``thread pool``: the same env with a blocking ``time.sleep``, one thread per env stepping
  it (``ThreadPoolExecutor.map`` per batch step);
* ``gymnasium AsyncVectorEnv``: that blocking env in subprocesses, ``step_async``/``step_wait``
  (64 envs only: 1,024 processes do not fit this machine).

A last case gives 256 envs a heavy-tailed latency (lognormal, median 20 ms, p99 500 ms) and
compares lock-step batches with barrier-free ones (``AsyncEnvPool(min_ready=k)``), under uvloop.

``overhead`` is what a row adds per env-step beyond the wait itself:
``(1 / frames_per_s - delay / n)`` in microseconds, i.e. the wall time of one batch step
minus the wait, divided by the envs. The ``limit`` column is ``n / delay`` (no overhead).

    PYTHONPATH=. python benchmarks/bench_async_envs.py              # about 6 minutes on 2 cores
    PYTHONPATH=. python benchmarks/bench_async_envs.py --quick      # smoke run

See benchmarks/README.md for what each row means.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import anyio
import numpy as np
from gymnasium import Env, spaces

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
from _harness import Col, log


class Waiting:
    """A coroutine env: ``step`` awaits ``delay`` seconds (``anyio.sleep``)."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, delay: float) -> None:
        self.delay, self.t = delay, 0

    async def reset(self, *, seed: int | None = None) -> tuple[Any, dict]:
        self.t = 0
        return np.zeros(1, np.float32), {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        await anyio.sleep(self.delay)
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= 1000, False, {}


class HeavyTailed(Waiting):
    """Lognormal step latency: median 20 ms, p99 500 ms (sigma = ln(25) / 2.326)."""

    SIGMA = float(np.log(25.0) / 2.3263)

    def __init__(self, seed: int) -> None:
        super().__init__(0.0)
        self.rng = np.random.default_rng(seed)

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        await anyio.sleep(float(0.020 * np.exp(self.SIGMA * self.rng.standard_normal())))
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= 1000, False, {}


def run_heavy_tailed(n: int, frames: int, batches: int, min_ready: int | None, options: dict) -> float:
    from aiocollect import AsyncEnvPool, Collector

    async def main() -> float:
        pool = lambda: AsyncEnvPool([HeavyTailed(i) for i in range(n)], min_ready=min_ready)  # noqa: E731
        async with Collector(pool, frames_per_batch=frames, total_frames=frames * (batches + 1)) as c:
            start, got = 0.0, 0
            async for b in c:
                if start == 0.0:
                    start = time.perf_counter()
                    continue
                got += b.numel()
            return got / (time.perf_counter() - start)

    return anyio.run(main, backend="asyncio", backend_options=options)


class Blocking(Env):
    """The same env for threads and subprocesses: ``step`` sleeps ``delay`` seconds."""

    observation_space = spaces.Box(-np.inf, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, delay: float = 0.0) -> None:
        self.delay, self.t = delay, 0

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict]:
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        if self.delay:
            time.sleep(self.delay)
        self.t += 1
        return np.array([self.t], np.float32), 1.0, self.t >= 1000, False, {}


def run_aiocollect(
    n: int,
    delay: float,
    steps: int,
    batches: int,
    backend: str,
    options: dict,
    min_ready: int | None = None,
    gc_freeze: bool | None = None,
) -> float:
    from aiocollect import AsyncEnvPool, Collector

    async def main() -> float:
        pool = lambda: AsyncEnvPool([Waiting(delay) for _ in range(n)], min_ready=min_ready, gc_freeze=gc_freeze)  # noqa: E731
        async with Collector(pool, frames_per_batch=n * steps, total_frames=n * steps * (batches + 1)) as c:
            start, frames = 0.0, 0
            async for b in c:
                if start == 0.0:
                    start = time.perf_counter()  # the first batch pays for start-up
                    continue
                frames += b.numel()
            return frames / (time.perf_counter() - start)

    return anyio.run(main, backend=backend, backend_options=options)


def heartbeat_p99(
    n: int, delay: float, steps: int, batches: int, options: dict, gc_freeze: bool | None
) -> tuple[float, float]:
    """(frames/s, p99 gap in ms) of a 1 ms heartbeat task on the loop that collects ``n`` envs.

    ``gc_freeze``: the pool's option (``None``, its default, freezes the GC at 256 envs and
    more: the cyclic GC's full collections no longer scan the objects that existed before).
    """
    from aiocollect import AsyncEnvPool, Collector

    async def main() -> tuple[float, float]:
        hb = h.Heartbeat()
        pool = lambda: AsyncEnvPool([Waiting(delay) for _ in range(n)], gc_freeze=gc_freeze)  # noqa: E731
        async with anyio.create_task_group() as tg:
            tg.start_soon(hb.run)
            start = time.perf_counter()
            async with Collector(pool, frames_per_batch=n * steps, total_frames=n * steps * batches) as c:
                frames = sum([b.numel() async for b in c])
            hb.stop()
        return frames / (time.perf_counter() - start), h.percentile(hb.gaps(), 99) * 1e3

    return anyio.run(main, backend="asyncio", backend_options=options)


def run_bare(n: int, delay: float, steps: int, batches: int) -> float:
    async def main() -> float:
        envs = [Waiting(delay) for _ in range(n)]
        obs = np.zeros((n, 1), np.float32)
        rng = np.random.default_rng(0)
        for i, e in enumerate(envs):
            obs[i] = (await e.reset())[0]
        start = time.perf_counter()
        for _ in range(steps * batches):
            actions = rng.integers(0, 2, n).tolist()
            results = await asyncio.gather(*(e.step(a) for e, a in zip(envs, actions, strict=True)))
            for i, r in enumerate(results):
                obs[i] = r[0]
        return n * steps * batches / (time.perf_counter() - start)

    return asyncio.run(main())


def run_threads(n: int, delay: float, steps: int, batches: int) -> float:
    envs = [Blocking(delay) for _ in range(n)]
    rng = np.random.default_rng(0)
    obs = np.zeros((n, 1), np.float32)
    with ThreadPoolExecutor(n) as pool:
        list(pool.map(lambda e: e.reset(), envs))
        start = time.perf_counter()
        for _ in range(steps * batches):
            actions = rng.integers(0, 2, n).tolist()
            for i, r in enumerate(pool.map(lambda ea: ea[0].step(ea[1]), zip(envs, actions, strict=True))):
                obs[i] = r[0]
        return n * steps * batches / (time.perf_counter() - start)


def run_gym_async(n: int, delay: float, steps: int, batches: int) -> float:
    from gymnasium.vector import AsyncVectorEnv

    env = AsyncVectorEnv([partial(Blocking, delay)] * n, context="forkserver")
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        start = time.perf_counter()
        for _ in range(steps * batches):
            env.step_async(rng.integers(0, 2, n))
            env.step_wait()
        return n * steps * batches / (time.perf_counter() - start)
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(__doc__, quick="smoke run: fewer batches, 64 envs only", strict=False)
    ap.add_argument("--rounds", type=int, default=3, help="rounds per case; each row's median is reported")
    args = ap.parse_args(argv)
    cases = [(64, 0.0), (64, 0.01)] if args.quick else [(64, 0.0), (64, 0.01), (1024, 0.0), (1024, 0.01)]
    batches = 2 if args.quick else 6
    if args.quick:
        args.rounds = 1
    steps = 16
    uvloop = {"use_uvloop": True}
    run = h.Session("numpy", "gymnasium", "anyio", "uvloop", "trio", "aiocollect")
    run.header(
        f"bench_async_envs: {'QUICK' if args.quick else 'full'} run, {args.rounds} round(s) per case, "
        f"{batches} timed batches of {steps} steps of every env",
        "",
    )
    rows: list[dict[str, Any]] = []
    cols = [Col("row", width=28, left=True), Col("frames/s", width=10), Col("overhead us/env-step", width=21)]
    cols.append(Col("vs bare", width=8))
    for n, delay in cases:
        limit = n / delay if delay else float("inf")
        log(f"\n{n} envs, step wait {delay * 1e3:g} ms (limit {limit:,.0f} frames/s)")
        case = (n, delay, steps, batches)
        makers: dict[str, Any] = {
            "aiocollect asyncio": partial(run_aiocollect, *case, "asyncio", {}),
            "aiocollect uvloop": partial(run_aiocollect, *case, "asyncio", uvloop),
            "aiocollect trio": partial(run_aiocollect, *case, "trio", {}),
            "aiocollect uvloop, barrier-free": partial(run_aiocollect, *case, "asyncio", uvloop, max(1, n // 4)),
            "aiocollect trio, barrier-free": partial(run_aiocollect, *case, "trio", {}, max(1, n // 4)),
            "bare asyncio loop": partial(run_bare, *case),
            "thread pool": partial(run_threads, *case),
        }
        if n <= 64:
            makers["gymnasium AsyncVectorEnv"] = partial(run_gym_async, *case)
        else:  # the pool freezes the GC by default at this size; the bare loop does not
            makers["aiocollect uvloop, gc_freeze=False"] = partial(
                run_aiocollect, *case, "asyncio", uvloop, None, False
            )
        # Rows interleaved round by round, so a slow patch of a shared machine hits them all.
        samples: dict[str, list[float]] = {name: [] for name in makers}
        for _, name in h.round_robin(list(makers), args.rounds):
            samples[name].append(makers[name]())
        runs = {name: h.median(v) for name, v in samples.items()}
        bare = runs["bare asyncio loop"]
        cells = []
        for name, fps in runs.items():
            overhead = (1 / fps - delay / n) * 1e6
            cells.append([name, f"{fps:,.0f}", f"{overhead:.1f}", h.fmt_x(h.div(fps, bare))])
            rows.append({"envs": n, "delay": delay, "row": name, "fps": fps, "overhead_us": overhead})
        for line in h.console_table(cols, cells):
            log("  " + line)
    log("\n1024 envs, step wait 10 ms, uvloop: a 1 ms heartbeat task on the same loop")
    for gc_freeze in (None, False):
        fps, p99 = heartbeat_p99(1024, 0.01, steps, batches, uvloop, gc_freeze)
        name = "default (gc_freeze)" if gc_freeze is None else "gc_freeze=False"
        log(f"  {name:28s} {fps:10,.0f} frames/s, heartbeat p99 gap {p99:.1f} ms")
        rows.append({"envs": 1024, "delay": 0.01, "row": f"heartbeat, {name}", "fps": fps, "p99_ms": p99})
    n = 256
    frames, hb = (n * 4, 1) if args.quick else (n * 8, 3)
    log(f"\n{n} envs, heavy-tailed step latency (lognormal, median 20 ms, p99 500 ms), uvloop")
    lock = run_heavy_tailed(n, frames, hb, None, uvloop)
    free = {k: run_heavy_tailed(n, frames, hb, k, uvloop) for k in (1, 16, 64)}
    log(f"  {'lock-step':28s} {lock:10,.0f} frames/s")
    rows.append({"envs": n, "delay": "lognormal", "row": "lock-step", "fps": lock})
    for k, fps in free.items():
        log(f"  {f'barrier-free min_ready={k}':28s} {fps:10,.0f} frames/s {fps / lock:8.2f}x lock-step")
        rows.append({"envs": n, "delay": "lognormal", "row": f"barrier-free min_ready={k}", "fps": fps})
    run.footer()
    run.write_json(args.json, rows=rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
