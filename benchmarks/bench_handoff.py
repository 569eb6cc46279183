#!/usr/bin/env python
"""Hand-off cost per batch: what a collector adds around its step loop, with the loop made free.

Each row times ``next()`` (or ``__anext__``) of an in-process collector over CartPole x8 whose
rollout returns a batch it already holds, so what is timed is only the way to the step loop and
back: the portal and lane threads, the producer task and stream, the stats. Every call comes
after ``--idle-ms`` of busy work in the calling thread, as in the paired benchmark, where a
bare-loop batch runs between two collector batches; on a VM whose idle vCPUs halt, a thread
that has slept wakes slowly and runs slowly at first. The blocking rows and the thread round
trip take turns call by call; the async row runs after them, on an event loop in this thread:

* **SyncDataCollector**: the blocking twin inside ``with``, as ``bench_collect.py --paired`` runs it;
* **SyncDataCollector, anyio spawn**: the same, its portal calls made the way they were before
  2026-11-27, through anyio's ``BlockingPortal.start_task_soon`` (which waits for the loop to
  spawn the task: one more thread round trip per call);
* **Collector (asyncio)**: the async collector inside ``async with``, on this thread's loop;
* **thread round trip**: the floor, one ``threading.Event`` each way to a sleeping thread.

Usage::

    python benchmarks/bench_handoff.py               # 300 calls per row, 12 ms idle
    python benchmarks/bench_handoff.py --quick       # 30 calls per row
    python benchmarks/bench_handoff.py --idle-ms 0   # back to back
"""

from __future__ import annotations

import functools
import os
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
import _workloads as wl
import anyio
import torch
from _harness import Col, log

import aiocollect
from aiocollect._core import _portal

FPB = 800


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _anyio_spawn_call(self: Any, fn: Callable[..., Any], *args: Any, interruptible: bool = True) -> Any:
    # Portal.call as it was: anyio's start_task_soon returns once the loop has spawned the task.
    self._get()
    with _portal._SigintGuard(self._wakeup) as guard:
        future = self._portal.start_task_soon(_portal._adopting, torch.get_num_threads(), fn, *args)
        guard.wait(future, interruptible=interruptible)
    return future.result()


def _free_rollout(rollout: Any, batch: Any) -> None:
    rollout.collect = lambda random, out=None: batch


def _blocking(
    env_fn: Callable[[], Any], policy: torch.nn.Module, anyio_spawn: bool
) -> tuple[Callable[[], Any], Callable[[], None]]:
    c = aiocollect.SyncDataCollector(env_fn, policy, frames_per_batch=FPB, total_frames=-1)
    if anyio_spawn:
        c._portal.call = types.MethodType(_anyio_spawn_call, c._portal)
    c.__enter__()
    it = iter(c)
    _free_rollout(c._async._rollout, next(it))
    return it.__next__, lambda: c.__exit__(None, None, None)


def _thread_round_trip() -> tuple[Callable[[], Any], Callable[[], None]]:
    ask, answer = threading.Event(), threading.Event()
    stop = False

    def serve() -> None:
        while ask.wait() and not stop:
            ask.clear()
            answer.set()

    threading.Thread(target=serve, daemon=True).start()

    def call() -> None:
        ask.set()
        answer.wait()
        answer.clear()

    def close() -> None:
        nonlocal stop
        stop = True
        ask.set()

    return call, close


def _timed(calls: int, idle: float, rows: dict[str, Callable[[], Any]], times: dict[str, list[float]]) -> None:
    for i in range(calls):
        names = list(rows) if i % 2 == 0 else list(reversed(rows))  # neither always first
        for name in names:
            _spin(idle)
            t0 = time.perf_counter()
            rows[name]()
            times[name].append(time.perf_counter() - t0)


def _measure(calls: int, idle: float) -> dict[str, list[float]]:
    policy = wl.seeded(wl.DiscretePolicy, 4, 2)
    env_fn = functools.partial(wl.make_vec, "CartPole-v1", 8)
    times: dict[str, list[float]] = {}
    # The blocking rows first, outside any event loop (a blocking twin refuses to run in one).
    opened = {
        "SyncDataCollector": _blocking(env_fn, policy, anyio_spawn=False),
        "SyncDataCollector, anyio spawn": _blocking(env_fn, policy, anyio_spawn=True),
        "thread round trip": _thread_round_trip(),
    }
    try:
        times.update({name: [] for name in opened})
        _timed(calls, idle, {name: call for name, (call, _) in opened.items()}, times)
    finally:
        for _, close in opened.values():
            close()

    async def async_row() -> None:
        collector = aiocollect.Collector(env_fn, policy, frames_per_batch=FPB, total_frames=-1)
        async with collector:
            _free_rollout(collector._rollout, await collector.__anext__())
            ts = times["Collector (asyncio)"] = []
            for _ in range(calls):
                _spin(idle)
                t0 = time.perf_counter()
                await collector.__anext__()
                ts.append(time.perf_counter() - t0)

    anyio.run(async_row)
    return times


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(__doc__, quick="30 calls per row", strict=False)
    ap.add_argument("--calls", type=int, default=300, help="calls per row (default 300)")
    ap.add_argument("--idle-ms", type=float, default=12.0, help="busy work before each call, ms (default 12)")
    args = ap.parse_args(argv)
    calls = 30 if args.quick else args.calls
    torch.set_num_threads(1)
    run = h.Session("torch", "anyio", "gymnasium")
    run.header("bench_handoff: per-batch hand-off, the step loop made free", "torch threads=1")
    times = _measure(calls, args.idle_ms / 1e3)
    records = [
        {"row": name, "median_us": h.median(ts) * 1e6, "p90_us": h.percentile(ts, 90) * 1e6, "calls": len(ts)}
        for name, ts in times.items()
    ]
    cols = [
        Col("row", "{row}", left=True),
        Col("median (us)", lambda r: h.fmt_n(r["median_us"])),
        Col("p90 (us)", lambda r: h.fmt_n(r["p90_us"])),
        Col("calls", "{calls}"),
    ]
    log(f"\n{calls} calls per row, each after {args.idle_ms:g} ms of busy work in the calling thread\n")
    for line in h.markdown_table(cols, records):
        log(line)
    run.footer()
    if args.json:
        run.write_json(args.json, rows=records, calls=calls, idle_ms=args.idle_ms)
    return 0


if __name__ == "__main__":
    sys.exit(main())
