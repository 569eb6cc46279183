#!/usr/bin/env python
"""Replay buffers side by side: extend/sample throughput and background collection into a buffer.

Compares, in ONE process and with the same TensorDict payloads:

* aiocollect's ``ReplayBuffer`` (uniform and ``PrioritizedSampler(alpha=0.6, beta=0.4)``), used
  three ways: ``await rb.sample()`` under ``anyio.run``, the blocking twin's ``rb.sample()``
  (through its event-loop portal thread) and ``sample_nowait()`` (a direct call),
* TorchRL's ``ReplayBuffer(storage=LazyTensorStorage(cap), sampler=RandomSampler())`` and
  ``TensorDictPrioritizedReplayBuffer(alpha=0.6, beta=0.4)`` (skipped with a note if torchrl or
  its C++ segment-tree extension is missing),

on extend throughput and sample throughput (batches of 256), for two payloads: CartPole-v1
rollouts (one real ``[8, 100]`` batch in TorchRL's collector layout) and Atari-like ``[8, 32]``
batches of 84x84 uint8 frames.

Then end-to-end background collection into a buffer, on the same workload for both libraries
(CartPole-v1 as a gymnasium SyncVectorEnv of 8, a 64-64 MLP argmax policy, 800 frames per batch):
TorchRL's ``Collector(..., replay_buffer=rb).start()`` (a background thread) and
``MultiAsyncCollector([env] * 2, ..., replay_buffer=rb).start()`` against aiocollect's
``SyncDataCollector``, async ``Collector`` and ``MultiaSyncDataCollector`` with ``start()``. Each
run measures frames written per second with nobody sampling ("collect only"), then while the
main thread (or an async task) samples batches of 256 in a loop ("+ learner").

The output ends with PASS/FAIL lines against the project's targets and a Markdown table.

Usage::

    python benchmarks/bench_buffer.py            # full run (about 4-5 min on 2 idle cores)
    python benchmarks/bench_buffer.py --quick    # CI smoke (under a minute on 2 idle cores)

See benchmarks/README.md for what each row means and the fairness rules.
"""

from __future__ import annotations

import argparse
import functools
import gc
import importlib.util
import json
import logging
import math
import multiprocessing
import os
import platform
import statistics
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import gymnasium as gym
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

import aiocollect
import aiocollect.blocking

# The single-process benchmark's helpers (policy, env modes, formatting). Spawned workers
# re-import this module, and with it this path setup, so they can import it too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_collect as bc

ENVS = 8  # CartPole envs per SyncVectorEnv
FPB = 800  # frames per batch: [8 envs, 100 steps]
BATCH = 256  # sample batch size, every row
ALPHA, BETA = 0.6, 0.4  # prioritized replay, both libraries
NUM_WORKERS = 2
BG_CAPACITY = 100_000  # frames, background-collection buffers
POLL_S = 0.001  # how often the write count is read while nobody samples
SETTLE_BATCHES = 2  # per worker, after the first write, before the windows start
TARGETS = {
    "sample_vs_torchrl": 1.0,  # aiocollect sample_nowait / async sample vs TorchRL, same sampler
    "background_vs_torchrl": 2.0,  # frames written per second, same workload and role
}
SAME_STEP, DISABLED = bc.SAME_STEP, bc.DISABLED
Log = Callable[[str], None]


# --------------------------------------------------------------------------------------------
# Environments (module level: picklable for spawned workers), policy and payloads
# --------------------------------------------------------------------------------------------


def make_cartpole8() -> gym.vector.VectorEnv:
    """bench_collect's CartPole x8: a SyncVectorEnv of 8 in SAME_STEP autoreset mode."""
    return gym.make_vec("CartPole-v1", ENVS, vectorization_mode="sync", vector_kwargs={"autoreset_mode": SAME_STEP})


def trl_cartpole8() -> Any:
    """TorchRL's fastest in-process setup for the same vector env (see bench_collect): its
    GymWrapper around a SyncVectorEnv of 8 in AutoresetMode.DISABLED."""
    from torchrl.envs import GymWrapper

    env = gym.make_vec("CartPole-v1", ENVS, vectorization_mode="sync", vector_kwargs={"autoreset_mode": DISABLED})
    return GymWrapper(env, categorical_action_encoding=True)


def make_policy() -> nn.Module:
    torch.manual_seed(0)  # same MLP weights on every run
    return bc.DiscretePolicy(4, 2)


def cartpole_payload(policy: nn.Module) -> TensorDict:
    """One real [8, 100] batch, collected by aiocollect from seeded envs, as a dense unnamed
    TensorDict (aiocollect names the time dim; TorchRL's buffers do not expect names)."""

    async def collect() -> TensorDictBase:
        c = aiocollect.Collector(make_cartpole8, policy, frames_per_batch=FPB, total_frames=FPB)
        c.set_seed(0)
        async with c:
            return await c.__anext__()

    batch = anyio.run(collect)
    leaves = {k: v.clone() for k, v in batch.items(include_nested=True, leaves_only=True)}
    return TensorDict(leaves, batch_size=batch.batch_size)


def atari_payload(envs: int = 8, steps: int = 32) -> TensorDict:
    """An Atari-like [8, 32] batch: 84x84 uint8 observation and next observation, int64 action,
    float32 reward, bool done flags and int64 trajectory ids, in TorchRL's layout."""
    g = torch.Generator().manual_seed(0)
    shape = (envs, steps)

    def frames() -> torch.Tensor:
        return torch.randint(0, 256, (*shape, 84, 84), dtype=torch.uint8, generator=g)

    term = torch.rand(*shape, 1, generator=g) < 0.01
    trunc = torch.rand(*shape, 1, generator=g) < 0.002
    no = torch.zeros(*shape, 1, dtype=torch.bool)
    return TensorDict(
        {
            "observation": frames(),
            "action": torch.randint(0, 6, shape, generator=g),
            "done": no,
            "terminated": no.clone(),
            "truncated": no.clone(),
            ("next", "observation"): frames(),
            ("next", "reward"): torch.randn(*shape, 1, generator=g),
            ("next", "done"): term | trunc,
            ("next", "terminated"): term,
            ("next", "truncated"): trunc,
            ("collector", "traj_ids"): torch.arange(envs).unsqueeze(1).expand(shape).clone(),
        },
        batch_size=shape,
    )


@dataclass
class Payload:
    key: str
    title: str
    td: TensorDict  # [envs, T], as a collector produces it
    capacity: int  # frames

    @property
    def flat(self) -> TensorDict:
        return self.td.reshape(-1)

    @property
    def frame_bytes(self) -> int:
        return sum(v[0, 0].numel() * v.element_size() for v in self.td.values(True, True))


# --------------------------------------------------------------------------------------------
# TorchRL availability (nothing of TorchRL is imported at module level)
# --------------------------------------------------------------------------------------------


def torchrl_missing() -> str | None:
    if importlib.util.find_spec("torchrl") is None:
        return "torchrl is not installed"
    try:
        import torchrl.collectors
        import torchrl.data  # noqa: F401
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


def torchrl_prioritized_missing() -> str | None:
    """Why TorchRL's PrioritizedSampler cannot be built here (it needs torchrl's C++ extension)."""
    try:
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler

        PrioritizedSampler(16, alpha=ALPHA, beta=BETA)
    except Exception as exc:
        why = f"{type(exc).__name__}: {exc}"
        try:
            import torchrl._torchrl  # noqa: F401
        except Exception as ext:
            msg = str(ext)
            if "undefined symbol" in msg:
                msg = (
                    "undefined symbol: torchrl's C++ extension was built against another torch "
                    f"than the installed {torch.__version__}"
                )
            why += f" (import torchrl._torchrl: {type(ext).__name__}: {msg[:160]})"
        return why
    return None


def torchrl_collector_classes() -> tuple[type, type]:
    import torchrl.collectors as trc

    single = getattr(trc, "Collector", None) or trc.SyncDataCollector  # 0.14 names first
    multi = getattr(trc, "MultiAsyncCollector", None) or trc.MultiaSyncDataCollector
    return single, multi


# --------------------------------------------------------------------------------------------
# Part 1: extend and sample
# --------------------------------------------------------------------------------------------


@dataclass
class OpRow:
    payload: str
    op: str  # "extend" | "sample"
    name: str
    kind: str  # "torchrl" (the reference) | "torchrl_extra" | "aio" | "aio_extra"
    sampler: str  # "uniform" | "prioritized"
    way: str  # "direct" | "async" | "blocking" | "nowait"
    frames: int  # frames per call
    runner: Callable[[int], float]  # calls -> seconds
    calls: int = 0
    runs: list[float] = field(default_factory=list)  # calls/s of each timed run
    error: str | None = None

    @property
    def cps(self) -> float:
        return statistics.median(self.runs) if self.runs else math.nan

    @property
    def fps(self) -> float:
        return self.cps * self.frames

    @property
    def spread(self) -> float:
        r = self.runs
        return (max(r) - min(r)) / statistics.median(r) if len(r) > 1 else 0.0


def direct_runner(fn: Callable[[], Any]) -> Callable[[int], float]:
    def run(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t

    return run


def async_runner(afn: Callable[[], Awaitable[Any]]) -> Callable[[int], float]:
    """Each timed run is one ``anyio.run``; the clock starts inside the loop."""

    def run(n: int) -> float:
        async def main() -> float:
            t = time.perf_counter()
            for _ in range(n):
                await afn()
            return time.perf_counter() - t

        return anyio.run(main)

    return run


@dataclass
class Buffers:
    """Every buffer of one payload; ``close()`` releases them."""

    aio: list[Any] = field(default_factory=list)  # async buffers and blocking twins
    torchrl: list[Any] = field(default_factory=list)
    prioritized: list[Any] = field(default_factory=list)

    def close(self) -> None:
        for rb in self.aio:
            (rb.close if isinstance(rb, aiocollect.blocking.ReplayBuffer) else rb.close_now)()
        self.aio, self.torchrl, self.prioritized = [], [], []
        gc.collect()


def _fill(extend: Callable[[], Any], frames: int, cap: int) -> None:
    for _ in range(-(-cap // frames) + 1):  # one past the capacity: the ring is full
        extend()


def _afill(rb: aiocollect.ReplayBuffer, data: TensorDictBase, cap: int) -> None:
    async def go() -> None:
        for _ in range(-(-cap // data.numel()) + 1):
            await rb.extend(data)

    anyio.run(go)


def build_op_rows(
    p: Payload, trl_missing: str | None, prio_missing: str | None, quick: bool
) -> tuple[list[OpRow], Buffers, list[str]]:
    """Create and fill every buffer of payload ``p``; return its extend and sample rows.

    Every buffer is extended with the same frames: the flattened [N] batch (``td.reshape(-1)``),
    except the informational rows that extend with the [envs, T] batch as collectors produce it.
    """
    flat, cap = p.flat, p.capacity
    bufs, notes, rows = Buffers(), [], []

    def add(op: str, name: str, kind: str, sampler: str, way: str, frames: int, run: Any) -> None:
        rows.append(OpRow(p.key, op, name, kind, sampler, way, frames, run))

    if trl_missing is None:
        from torchrl.data import (
            LazyTensorStorage,
            ReplayBuffer,
            TensorDictPrioritizedReplayBuffer,
            TensorDictReplayBuffer,
        )
        from torchrl.data.replay_buffers.samplers import RandomSampler

        def plain() -> Any:
            return ReplayBuffer(storage=LazyTensorStorage(cap), sampler=RandomSampler())

        def td_rb() -> Any:
            return TensorDictReplayBuffer(storage=LazyTensorStorage(cap), sampler=RandomSampler())

        def ndim2() -> Any:
            return ReplayBuffer(storage=LazyTensorStorage(cap, ndim=2), sampler=RandomSampler())

        def prio() -> Any:
            storage = LazyTensorStorage(cap)
            return TensorDictPrioritizedReplayBuffer(alpha=ALPHA, beta=BETA, storage=storage)

        # (name, kind, sampler, factory, batch to extend with). The TensorDict buffers' writer
        # adds an "index" entry to the batch it is given: they get their own shallow copy.
        specs = [
            ("TorchRL ReplayBuffer", "torchrl", "uniform", plain, flat),
            ("TorchRL TensorDictReplayBuffer", "torchrl_extra", "uniform", td_rb,
             flat.clone(False)),
            (f"TorchRL ReplayBuffer ndim=2, [{ENVS},T] batch", "torchrl_extra", "uniform", ndim2,
             p.td),
            ("TorchRL TensorDictPrioritizedReplayBuffer", "torchrl", "prioritized", prio,
             flat.clone(False)),
        ]  # fmt: skip
        for name, kind, sampler, factory, data in specs:
            if quick and kind == "torchrl_extra":
                continue
            if sampler == "prioritized" and prio_missing is not None:
                notes.append(f"{name} skipped: {prio_missing}")
                continue
            rb = factory()
            _fill(functools.partial(rb.extend, data), data.numel(), cap)
            bufs.torchrl.append(rb)
            if sampler == "prioritized":
                bufs.prioritized.append(rb)
            run = direct_runner(functools.partial(rb.extend, data))
            add("extend", name, kind, sampler, "direct", data.numel(), run)
            run = direct_runner(functools.partial(rb.sample, BATCH))
            add("sample", name, kind, sampler, "direct", BATCH, run)
    for sampler in ("uniform", "prioritized"):
        uniform = sampler == "uniform"

        def new(cls: type) -> Any:
            s = None if uniform else aiocollect.PrioritizedSampler(alpha=ALPHA, beta=BETA)  # noqa: B023
            return cls(cap, sampler=s)

        arb, brb = new(aiocollect.ReplayBuffer), new(aiocollect.blocking.ReplayBuffer)
        _afill(arb, flat, cap)
        _fill(functools.partial(brb.extend, flat), flat.numel(), cap)
        bufs.aio += [arb, brb]
        if not uniform:
            bufs.prioritized += [arb, brb]
        part = functools.partial
        ways = [
            # (op, call, kind, way, frames, runner)
            ("extend", "await extend()", "aio", "async", flat.numel(),
             async_runner(part(arb.extend, flat))),
            ("extend", "blocking extend()", "aio", "blocking", flat.numel(),
             direct_runner(part(brb.extend, flat))),
            ("extend", f"await extend() [{ENVS},T] batch", "aio_extra", "async", p.td.numel(),
             async_runner(part(arb.extend, p.td))),
            ("sample", "await sample()", "aio", "async", BATCH,
             async_runner(part(arb.sample, BATCH))),
            ("sample", "blocking sample()", "aio", "blocking", BATCH,
             direct_runner(part(brb.sample, BATCH))),
            ("sample", "sample_nowait()", "aio", "nowait", BATCH,
             direct_runner(part(brb.sample_nowait, BATCH))),
        ]  # fmt: skip
        for op, call, kind, way, frames, run in ways:
            if kind == "aio_extra" and (quick or not uniform):
                continue
            add(op, f"aiocollect {sampler}, {call}", kind, sampler, way, frames, run)
    # Same data in, same data out: every buffer's sample has the payload's entries.
    want = set(flat.keys(True, True))
    for rb in bufs.torchrl + bufs.aio:
        s = rb.sample_nowait(BATCH) if hasattr(rb, "sample_nowait") else rb.sample(BATCH)
        got = set(s.keys(True, True))
        if s.batch_size != torch.Size([BATCH]) or not want <= got:
            keys = sorted(map(str, got))
            raise RuntimeError(f"{type(rb).__name__} sampled {s.batch_size} with {keys}")
    return rows, bufs, notes


def randomize_priorities(bufs: Buffers, cap: int) -> None:
    """Give every stored frame a random priority (the same values in every buffer), as a
    learner's update_priority calls would, so sampling descends a non-uniform tree."""
    # float32: TorchRL's segment trees reject float64 priorities.
    prio = torch.rand(cap, generator=torch.Generator().manual_seed(1)) * 10
    for rb in bufs.prioritized:
        rb.update_priority(torch.arange(cap), prio)


def calibrate(row: OpRow, target_s: float, min_calls: int = 3) -> None:
    """Warm the row up and size its timed runs to about ``target_s``."""
    k, dt = 1, 0.0
    while k < 100_000:
        dt = row.runner(k)
        if dt >= 0.03:
            break
        k *= 4
    row.calls = max(min_calls, math.ceil(target_s * k / max(dt, 1e-9)))


def run_op_rows(rows: list[OpRow], repeats: int, target_s: float, log: Log) -> None:
    """Warm up and size every row, then time them round robin."""
    live = []
    for row in rows:
        try:
            calibrate(row, target_s)
            live.append(row)
        except Exception as exc:  # reported; the other rows go on
            row.error = f"{type(exc).__name__}: {exc}"
            log(f"  ERROR   {row.op:<6} {row.name}: {row.error}")
    for rep in range(repeats):
        for row in live:
            dt = row.runner(row.calls)
            row.runs.append(row.calls / dt)
            log(
                f"  run {rep + 1}/{repeats} {row.op:<6} {row.name:<50} {row.calls / dt:8.0f} "
                f"calls/s {row.calls * row.frames / dt:10.0f} frames/s"
            )


# --------------------------------------------------------------------------------------------
# Part 2: background collection into a buffer
# --------------------------------------------------------------------------------------------


@dataclass
class BgRun:
    first_s: float  # construction -> first frames in the buffer
    settle_s: float  # first write -> SETTLE_BATCHES more batches per worker
    collect_fps: float  # frames written per second, nobody sampling
    learner_fps: float  # frames written per second while the learner samples
    learner_bps: float  # batches of BATCH the learner sampled per second
    close_s: float  # shutdown time
    leaks: list[str] = field(default_factory=list)


@dataclass
class BgRow:
    name: str
    kind: str  # "torchrl" | "aio" | "aio_extra"
    role: str  # "single" | "multi": pairs aiocollect with TorchRL
    procs: int
    runner: Callable[[float], BgRun]  # window seconds -> BgRun
    runs: list[BgRun] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def med(self, attr: str) -> float:
        v = [getattr(r, attr) for r in self.runs if math.isfinite(getattr(r, attr))]
        return statistics.median(v) if v else math.nan

    @property
    def spread(self) -> float:
        f = [r.collect_fps for r in self.runs]
        return (max(f) - min(f)) / statistics.median(f) if len(f) > 1 else 0.0


class Window:
    """Frames written per second over a window, from the first change of the write count seen
    in the window to the last one (so that batch granularity does not count), and how many times
    the learner's ``step`` ran per second."""

    def __init__(self, frames: Callable[[], int]) -> None:
        self.frames = frames
        self.t0 = self.now = time.perf_counter()
        self.f0 = self.prev = frames()
        self.first: tuple[float, int] | None = None
        self.last: tuple[float, int] | None = None
        self.steps = 0

    def tick(self, stepped: bool) -> None:
        self.steps += stepped
        self.now = time.perf_counter()
        f = self.frames()
        if f != self.prev:
            self.prev = f
            self.first = self.first or (self.now, f)
            self.last = (self.now, f)

    def result(self) -> tuple[float, float]:
        span = self.now - self.t0
        if self.first and self.last and self.last[0] > self.first[0]:
            fps = (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])
        else:
            fps = (self.prev - self.f0) / span
        return fps, self.steps / span


def window(frames: Callable[[], int], seconds: float, step: Callable[[], Any] | None) -> tuple[float, float]:
    w = Window(frames)
    while w.now < w.t0 + seconds:
        if step is None:
            time.sleep(POLL_S)
        else:
            step()
        w.tick(step is not None)
    return w.result()


async def awindow(
    frames: Callable[[], int], seconds: float, step: Callable[[], Awaitable[Any]] | None
) -> tuple[float, float]:
    w = Window(frames)
    while w.now < w.t0 + seconds:
        if step is None:
            await anyio.sleep(POLL_S)
        else:
            await step()
        w.tick(step is not None)
    return w.result()


def _wait_frames(frames: Callable[[], int], n: int, t0: float, what: str) -> float:
    while frames() < n:
        if time.perf_counter() - t0 > 180:
            raise TimeoutError(f"{what}: fewer than {n} frames written within 180 s")
        time.sleep(POLL_S)
    return time.perf_counter() - t0


async def _await_frames(frames: Callable[[], int], n: int, t0: float, what: str) -> float:
    while frames() < n:
        if time.perf_counter() - t0 > 180:
            raise TimeoutError(f"{what}: fewer than {n} frames written within 180 s")
        await anyio.sleep(POLL_S)
    return time.perf_counter() - t0


def run_blocking(
    make: Callable[[], tuple[Any, Any]],
    frames: Callable[[Any], int],
    sample: Callable[[Any], Any],
    close: Callable[[Any, Any], None],
    seconds: float,
    workers: int,
) -> BgRun:
    """Construct (buffer, collector), start(), wait for the first write and for the pipeline
    to settle, measure both windows, shut down."""
    gc.collect()
    t0 = time.perf_counter()
    rb, c = make()
    count = functools.partial(frames, rb)
    try:
        c.start()
        first = _wait_frames(count, 1, t0, "first write")
        settle = SETTLE_BATCHES * max(1, workers) * FPB + count()
        settle_s = _wait_frames(count, settle, t0, "settling") - first
        collect, _ = window(count, seconds, None)
        learner, bps = window(count, seconds, functools.partial(sample, rb))
    finally:
        tc = time.perf_counter()
        close(rb, c)
        close_s = time.perf_counter() - tc
    return BgRun(first, settle_s, collect, learner, bps, close_s)


def _trl_frames(rb: Any) -> int:
    # With ndim=2 storage TorchRL's write_count counts time steps of its [T, 8] layout.
    return rb.write_count * ENVS


def _trl_close(rb: Any, c: Any) -> None:
    c.async_shutdown()


def _aio_close(rb: Any, c: Any) -> None:
    try:
        c.async_shutdown()
    finally:
        rb.close()


def _sample(rb: Any) -> Any:
    return rb.sample(BATCH)


def _sample_nowait(rb: Any) -> Any:
    return rb.sample_nowait(BATCH)


def _aio_frames(rb: Any) -> int:
    return rb.write_count


def trl_run(policy: nn.Module, seconds: float, multi: bool) -> BgRun:
    from tensordict.nn import TensorDictModule
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    single_cls, multi_cls = torchrl_collector_classes()

    def make() -> tuple[Any, Any]:
        # TorchRL's collectors extend with the whole [8, 100] batch: a storage of ndim=2 stores
        # frames (as [T, 8] steps); with ndim=1 each item would be a 100-step row (and 100k
        # items 10M frames). shared=True for the workers; the multi-process collector then
        # builds the storage here from a fake batch, and it moves to shared memory when it is
        # sent to the workers.
        rb = ReplayBuffer(storage=LazyTensorStorage(BG_CAPACITY, ndim=2), shared=multi)
        module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
        kw = {"frames_per_batch": FPB, "total_frames": -1, "replay_buffer": rb}
        if multi:
            return rb, multi_cls([trl_cartpole8] * NUM_WORKERS, module, **kw)
        return rb, single_cls(trl_cartpole8, module, **kw)

    return run_blocking(make, _trl_frames, _sample, _trl_close, seconds, multi * NUM_WORKERS)


def aio_run(policy: nn.Module, seconds: float, multi: bool, sample: Callable = _sample) -> BgRun:
    def make() -> tuple[Any, Any]:
        # A multi-process collector makes the (not yet built) buffer's storage shared memory.
        rb = aiocollect.blocking.ReplayBuffer(BG_CAPACITY)
        kw = {"frames_per_batch": FPB, "total_frames": -1, "replay_buffer": rb}
        if multi:
            cls = aiocollect.MultiaSyncDataCollector
            return rb, cls(make_cartpole8, policy, num_workers=NUM_WORKERS, **kw)
        return rb, aiocollect.SyncDataCollector(make_cartpole8, policy, **kw)

    return run_blocking(make, _aio_frames, sample, _aio_close, seconds, multi * NUM_WORKERS)


def aio_async_run(policy: nn.Module, seconds: float) -> BgRun:
    async def main() -> BgRun:
        rb = aiocollect.ReplayBuffer(BG_CAPACITY)
        frames = functools.partial(_aio_frames, rb)
        t0 = time.perf_counter()
        try:
            c = aiocollect.Collector(make_cartpole8, policy, frames_per_batch=FPB, total_frames=-1, replay_buffer=rb)
            async with c:
                c.start()
                first = await _await_frames(frames, 1, t0, "first write")
                settle = SETTLE_BATCHES * FPB + frames()
                settle_s = await _await_frames(frames, settle, t0, "settling") - first
                collect, _ = await awindow(frames, seconds, None)
                learner, bps = await awindow(frames, seconds, functools.partial(_sample, rb))
                tc = time.perf_counter()
            close_s = time.perf_counter() - tc
        finally:
            await rb.aclose()
        return BgRun(first, settle_s, collect, learner, bps, close_s)

    gc.collect()
    return anyio.run(main)


def build_bg_rows(policy: nn.Module, torchrl: bool, multi: bool, extra: bool) -> list[BgRow]:
    def bind(fn: Callable[..., BgRun], **kw: Any) -> Callable[[float], BgRun]:
        return lambda s: fn(policy, s, **kw)

    rows = []
    single_cls, multi_cls = torchrl_collector_classes() if torchrl else (None, None)
    if torchrl:
        name = f"TorchRL {single_cls.__name__}.start() (thread)"
        rows.append(BgRow(name, "torchrl", "single", 0, bind(trl_run, multi=False)))
    rows += [
        BgRow("aiocollect SyncDataCollector.start()", "aio", "single", 0,
              bind(aio_run, multi=False)),
        BgRow("aiocollect Collector.start() (asyncio)", "aio", "single", 0, bind(aio_async_run)),
    ]  # fmt: skip
    if extra:  # the blocking row again, its learner sampling without the portal hop
        rows.append(BgRow("aiocollect SyncDataCollector, learner nowait", "aio_extra", "single",
                          0, bind(aio_run, multi=False, sample=_sample_nowait)))  # fmt: skip
    if multi and torchrl:
        name = f"TorchRL {multi_cls.__name__}.start()"
        rows.append(BgRow(name, "torchrl", "multi", NUM_WORKERS, bind(trl_run, multi=True)))
    if multi:
        rows.append(BgRow("aiocollect MultiaSyncDataCollector.start()", "aio", "multi",
                          NUM_WORKERS, bind(aio_run, multi=True)))  # fmt: skip
    return rows


def _is_helper(t: threading.Thread) -> bool:
    """multiprocessing's resource-sharer thread: started the first time a file descriptor is
    sent to a spawned process (torch does so to share tensors), it serves for the process's
    lifetime. It is not a collector's thread."""
    target = getattr(t, "_target", None)
    return getattr(target, "__qualname__", "") == "_ResourceSharer._serve"


def leftovers(baseline: set[int], timeout: float = 3.0) -> tuple[list[str], list[str]]:
    """Child processes, and threads not alive before the benchmark (except helpers), still
    there after ``timeout``; and the long-lived helper threads."""
    deadline = time.perf_counter() + timeout
    while True:
        procs = [f"process {p.pid} {p.name}" for p in multiprocessing.active_children()]
        new = [t for t in threading.enumerate() if t.ident not in baseline and t.is_alive()]
        threads = [f"thread {t.name}" for t in new if not _is_helper(t)]
        helpers = [f"thread {t.name}" for t in new if _is_helper(t)]
        if not (procs or threads) or time.perf_counter() > deadline:
            return procs + threads, helpers


def run_bg_rows(rows: list[BgRow], repeats: int, seconds: float, baseline: set[int], log: Log) -> list[str]:
    """Time the rows round robin (no warmup run: the first run of a row is its cold start).
    Returns notes on long-lived helper threads that appeared (not counted as leaks)."""
    notes: list[str] = []
    seen: set[str] = set()
    for rep in range(repeats):
        for row in rows:
            try:
                r: BgRun | None = row.runner(seconds)
            except Exception as exc:  # reported; the other rows go on
                row.errors.append(f"{type(exc).__name__}: {exc}")
                log(f"  ERROR   {row.name}: {row.errors[-1]}")
                r = None
            left, helpers = leftovers(baseline)
            if left:
                log(f"  WARNING: {row.name}: still alive after shutdown: {left}")
            for h in set(helpers) - seen:
                seen.add(h)
                notes.append(
                    f"{h} (multiprocessing.resource_sharer; serves for the process's lifetime) "
                    f"appeared during a run of {row.name}; not counted as a leak"
                )
            if r is None:
                continue
            r.leaks = left
            row.runs.append(r)
            log(
                f"  run {rep + 1}/{repeats} {row.name:<45} 1st write {r.first_s * 1e3:5.0f} ms "
                f"(+{r.settle_s * 1e3:4.0f} ms settle)  collect {r.collect_fps:6.0f} fr/s  "
                f"+ learner {r.learner_fps:6.0f} fr/s "
                f"{r.learner_bps:5.0f} batches/s  close {r.close_s * 1e3:5.0f} ms"
            )
    return notes


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="See benchmarks/README.md for what each row means.",
    )
    ap.add_argument("--quick", action="store_true", help="CI smoke run (under a minute), noisy")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per buffer row (default 5, quick 2)")
    ap.add_argument(
        "--target-seconds",
        type=float,
        default=None,
        help="approximate length of one timed buffer run (default 0.25, --quick 0.1)",
    )
    ap.add_argument(
        "--bg-repeats",
        type=int,
        default=None,
        help="runs per background-collection row (default 3, --quick 1)",
    )
    ap.add_argument(
        "--bg-seconds",
        type=float,
        default=None,
        help="length of each measurement window of a background run (default 4, --quick 1.5)",
    )
    ap.add_argument(
        "--payload",
        action="append",
        choices=["cartpole", "atari"],
        help="run only this payload (repeatable)",
    )
    ap.add_argument("--no-background", action="store_true", help="skip background collection")
    ap.add_argument("--no-multiprocess", action="store_true", help="skip the multi-process background rows")
    ap.add_argument("--no-torchrl", action="store_true", help="skip the TorchRL rows")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--strict", action="store_true", help="exit with status 1 if a target FAILs")
    return ap.parse_args(argv)


def _cell(x: float) -> str:
    return bc.fmt_ratio(x) if math.isfinite(x) else "-"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    repeats = args.repeats or (2 if quick else 5)
    target_s = args.target_seconds or (0.1 if quick else 0.25)
    bg_repeats = args.bg_repeats or (1 if quick else 3)
    bg_seconds = args.bg_seconds or (1.5 if quick else 4.0)
    t_start, load_start = time.perf_counter(), bc._loadavg()
    # What TorchRL selects for itself in a fresh script, fixed before any process starts, so
    # that TorchRL's multi-process rows do not silently fork (aiocollect always spawns).
    multiprocessing.set_start_method("spawn", force=True)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    baseline_threads = {t.ident for t in threading.enumerate()}

    def log(msg: str = "") -> None:
        print(msg, flush=True)

    trl_missing = "disabled with --no-torchrl" if args.no_torchrl else torchrl_missing()
    prio_missing = None
    if trl_missing is None:
        logging.getLogger("torchrl").setLevel(logging.WARNING)  # silence its INFO chatter
        prio_missing = torchrl_prioritized_missing()
    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensordict": bc._dist_version("tensordict"),
        "gymnasium": gym.__version__,
        "anyio": bc._dist_version("anyio"),
        "torchrl": bc._dist_version("torchrl") if trl_missing is None else "not used",
        "aiocollect": aiocollect.__version__,
    }
    log(
        f"bench_buffer: {'QUICK (no informational rows)' if quick else 'full'} run; buffer rows: "
        f"{repeats} timed runs of ~{target_s:g} s after a warmup, sample batch {BATCH}; "
        f"background rows: {bg_repeats} run(s), windows of {bg_seconds:g} s"
    )
    log(f"  {platform.platform()}, {os.cpu_count()} CPUs, torch threads={torch.get_num_threads()}")
    log("  " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    if trl_missing is not None:
        log(f"  NOTE: TorchRL rows skipped ({trl_missing})")
    elif prio_missing is not None:
        log(f"  NOTE: TorchRL's prioritized rows skipped: {prio_missing}")
    log(f"  load average (1 min) at start: {load_start:.2f}")
    if load_start > 0.5:
        log("  WARNING: the machine is not idle; other processes share the CPUs and add noise.")

    policy = make_policy()
    payloads = []
    chosen = args.payload or ["cartpole", "atari"]
    if "cartpole" in chosen:
        td = cartpole_payload(policy)
        payloads.append(Payload("cartpole", f"CartPole-v1 [{ENVS}, 100]", td, 100_000))
    if "atari" in chosen:
        payloads.append(Payload("atari", "Atari-like 84x84 [8, 32]", atari_payload(), 20_000))

    # ---------------------------------------------------------------- part 1: buffers
    op_rows: list[OpRow] = []
    notes: list[str] = []
    phases = len(payloads) + (0 if args.no_background else 1)
    for i, p in enumerate(payloads):
        phase = time.perf_counter()
        mb = p.capacity * p.frame_bytes / 2**20
        log(
            f"\n[{i + 1}/{phases}] extend and sample: {p.title}, {p.flat.numel()} frames per "
            f"extend, {p.frame_bytes} bytes per frame, capacity {p.capacity} frames "
            f"({mb:.0f} MB per buffer)"
        )
        rows, bufs, why = build_op_rows(p, trl_missing, prio_missing, quick)
        notes += [n for n in why if n not in notes]
        # A full collection of the ~350k objects torch and TorchRL leave in the process takes
        # about 0.2 s: freeze them, so that none lands in one row's timed run and not another's.
        gc.collect()
        gc.freeze()
        log(f"  buffers built and filled ({time.perf_counter() - phase:.1f} s)")
        run_op_rows([r for r in rows if r.op == "extend"], repeats, target_s, log)
        randomize_priorities(bufs, p.capacity)  # after the extends, which reset them to the max
        run_op_rows([r for r in rows if r.op == "sample"], repeats, target_s, log)
        gc.unfreeze()
        bufs.close()
        op_rows += [r for r in rows if r.op == "extend"] + [r for r in rows if r.op == "sample"]
        log(f"  ({time.perf_counter() - phase:.1f} s)")

    # ---------------------------------------------------------------- part 2: background
    bg_rows: list[BgRow] = []
    bg_notes: list[str] = []
    if not args.no_background:
        phase = time.perf_counter()
        log(
            f"\n[{phases}/{phases}] background collection into a buffer: CartPole-v1 x{ENVS}, "
            f"{FPB} frames per batch, capacity {BG_CAPACITY}; windows of {bg_seconds:g} s: "
            f"collect only, then + learner sampling batches of {BATCH}"
        )
        bg_rows = build_bg_rows(policy, trl_missing is None, not args.no_multiprocess, not quick)
        gc.collect()
        gc.freeze()  # as above: no 0.2 s full collection inside a measurement window
        bg_notes = run_bg_rows(bg_rows, bg_repeats, bg_seconds, baseline_threads, log)
        gc.unfreeze()
        log(f"  ({time.perf_counter() - phase:.1f} s)")

    # ---------------------------------------------------------------- results
    def ref_op(payload: str, op: str, sampler: str) -> OpRow | None:
        key = (payload, op, sampler, "torchrl")
        return next((r for r in op_rows if (r.payload, r.op, r.sampler, r.kind) == key), None)

    def ref_bg(role: str) -> BgRow | None:
        return next((r for r in bg_rows if (r.kind, r.role) == ("torchrl", role)), None)

    titles = {p.key: p.title for p in payloads}
    op_table = []
    for r in op_rows:
        ref = ref_op(r.payload, r.op, r.sampler)
        op_table.append(
            {
                "payload": titles[r.payload],
                "op": r.op,
                "row": r.name,
                "kind": r.kind,
                "sampler": r.sampler,
                "way": r.way,
                "frames_per_call": r.frames,
                "calls_per_s": r.cps,
                "frames_per_s": r.fps,
                "us_per_call": 1e6 / r.cps if r.runs else math.nan,
                "vs_torchrl": r.fps / ref.fps if ref is not None and ref.runs else math.nan,
                "spread": r.spread,
                "runs_calls_per_s": r.runs,
                "error": r.error,
            }
        )
    bg_table = []
    for r in bg_rows:
        ref = ref_bg(r.role)

        def ratio(attr: str, r: BgRow = r, ref: BgRow | None = ref) -> float:
            return r.med(attr) / ref.med(attr) if ref is not None else math.nan

        bg_table.append(
            {
                "row": r.name,
                "kind": r.kind,
                "role": r.role,
                "procs": r.procs,
                "first_write_ms": r.med("first_s") * 1e3,
                "collect_fps": r.med("collect_fps"),
                "collect_vs_torchrl": ratio("collect_fps"),
                "learner_fps": r.med("learner_fps"),
                "learner_vs_torchrl": ratio("learner_fps"),
                "learner_batches_per_s": r.med("learner_bps"),
                "learner_batches_vs_torchrl": ratio("learner_bps"),
                "close_ms": r.med("close_s") * 1e3,
                "spread": r.spread,
                "runs": [vars(x) for x in r.runs],
                "errors": r.errors,
            }
        )

    # Targets.
    checks: list[tuple[str, bool | None, str]] = []
    need = TARGETS["sample_vs_torchrl"]
    for p in payloads:
        for sampler in ("uniform", "prioritized"):
            ref = ref_op(p.key, "sample", sampler)
            for way in ("nowait", "async"):
                key = (p.key, "sample", sampler, way, "aio")
                row = next(
                    (r for r in op_rows if (r.payload, r.op, r.sampler, r.way, r.kind) == key),
                    None,
                )
                if row is None:
                    continue
                desc = f"{p.title}: {row.name} >= {need:g}x TorchRL {sampler} sample"
                if ref is None or not ref.runs:
                    why = trl_missing or (prio_missing if sampler == "prioritized" else None)
                    why = why or (ref.error if ref is not None else "not run")
                    checks.append((desc, None, f"TorchRL row not run: {str(why)[:70]}"))
                elif not row.runs:
                    checks.append((desc, False, f"aiocollect row failed: {row.error}"))
                else:
                    x = row.cps / ref.cps
                    val = f"{x:.2f}x ({row.cps:.0f} vs {ref.cps:.0f} batches/s, {ref.name})"
                    checks.append((desc, x >= need, val))
    need = TARGETS["background_vs_torchrl"]
    for r in bg_rows:
        if r.kind != "aio":
            continue
        ref = ref_bg(r.role)
        for attr, label in (("collect_fps", "collect only"), ("learner_fps", "+ learner")):
            desc = f"background, {label}: {r.name} >= {need:g}x TorchRL frames/s written"
            if ref is None or not ref.runs:
                why = "not run" if ref is None else f"failed: {ref.errors}"
                checks.append((desc, None, f"TorchRL counterpart {why}"))
            elif not r.runs:
                checks.append((desc, False, f"failed: {r.errors}"))
            else:
                x = r.med(attr) / ref.med(attr)
                val = f"{x:.2f}x ({r.med(attr):.0f} vs {ref.med(attr):.0f} frames/s)"
                if attr == "learner_fps":
                    bps, ref_bps = r.med("learner_bps"), ref.med("learner_bps")
                    val += f"; learner {bps:.0f} vs {ref_bps:.0f} batches/s ({bps / ref_bps:.2f}x)"
                checks.append((desc, x >= need, val))
    if bg_rows:
        gc.collect()
        left, _ = leftovers(baseline_threads, 5.0)
        leaked = sorted({r.name for r in bg_rows for x in r.runs if x.leaks})
        clean = not left and not leaked
        checks.append(
            (
                "no collector process or thread left alive after shutdown",
                clean,
                "none" if clean else f"alive now: {left}; rows that left some: {leaked}",
            )
        )

    log("\n" + "=" * 122)
    log(
        f"RESULTS (1/2): extend and sample, median of {repeats} timed runs after a warmup; "
        f"x TorchRL: frames/s vs TorchRL's plain buffer with the same sampler"
    )
    hdr = (
        f"{'payload':<25} {'op':<6} {'row':<50} {'calls/s':>8} {'frames/s':>10} {'us/call':>7} "
        f"{'x TorchRL':>9} {'spread':>6}"
    )
    log(hdr)
    log("-" * len(hdr))
    for t in op_table:
        head = f"{t['payload']:<25} {t['op']:<6} {t['row']:<50}"
        if t["error"]:
            log(f"{head} ERROR {t['error'][:60]}")
            continue
        log(
            f"{head} {t['calls_per_s']:8.0f} {t['frames_per_s']:10.0f} {t['us_per_call']:7.0f} "
            f"{bc.fmt_ratio(t['vs_torchrl']):>9} {t['spread'] * 100:5.0f}%"
        )
    log(f"  calls/s: extend() or sample() calls per second (sample: batches of {BATCH}).")
    log("  frames/s: frames written or sampled per second. Extends write the flattened batch")
    log(f"  unless the row says [{ENVS},T] (as collectors produce it). spread: (max - min) /")
    log("  median of the timed runs; above ~15% the machine was busy.")
    for n in notes:
        log(f"  NOTE: {n}")

    if bg_table:
        log(
            f"\nRESULTS (2/2): background collection into a buffer, CartPole-v1 x{ENVS}; median "
            f"of {bg_repeats} run(s), {bg_seconds:g} s windows"
        )
        hdr = (
            f"{'row':<45} {'procs':>5} {'1st write':>9} {'collect':>8} {'x TorchRL':>9} "
            f"{'+learner':>8} {'x TorchRL':>9} {'batch/s':>7} {'x TorchRL':>9} {'close':>6} "
            f"{'spread':>6}"
        )
        log(hdr)
        log("-" * len(hdr))
        for t in bg_table:
            log(
                f"{t['row']:<45} {t['procs']:>5} {t['first_write_ms']:7.0f}ms "
                f"{t['collect_fps']:8.0f} {bc.fmt_ratio(t['collect_vs_torchrl']):>9} "
                f"{t['learner_fps']:8.0f} {bc.fmt_ratio(t['learner_vs_torchrl']):>9} "
                f"{t['learner_batches_per_s']:7.0f} "
                f"{bc.fmt_ratio(t['learner_batches_vs_torchrl']):>9} "
                f"{t['close_ms']:4.0f}ms {t['spread'] * 100:5.0f}%"
            )
        log("  procs: env worker processes (0 = in this process). 1st write: construction to the")
        log("  first frames in the buffer. collect: frames written per second, nobody sampling.")
        log("  +learner: the same while the main thread (async row: a task) samples batches of")
        log(f"  {BATCH} in a loop; batch/s: its batches per second. x TorchRL: vs TorchRL's")
        log("  collector of the same role. close: shutdown. spread: of the collect column.")
        for n in bg_notes:
            log(f"  NOTE: {n}")

    log("\nTargets:")
    any_fail = False
    for desc, ok, val in checks:
        any_fail |= ok is False
        log(f"  [{'SKIP' if ok is None else 'PASS' if ok else 'FAIL'}] {desc}: {val}")

    md = [
        "| payload | op | buffer, call | calls/s | frames/s | vs TorchRL |",
        "| --- | --- | --- | ---: | ---: | ---: |",
    ]
    md += [
        f"| {t['payload']} | {t['op']} | {t['row']} | {t['calls_per_s']:,.0f} "
        f"| {t['frames_per_s']:,.0f} | {_cell(t['vs_torchrl'])} |"
        for t in op_table
        if not t["error"]
    ]
    if bg_table:
        md += [
            "",
            "| background collection, CartPole-v1 x8 | env procs | first write (ms) "
            "| collect only (frames/s) | vs TorchRL | + learner (frames/s) | vs TorchRL "
            "| learner (batches/s) | vs TorchRL |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        md += [
            f"| {t['row']} | {t['procs']} | {t['first_write_ms']:,.0f} | {t['collect_fps']:,.0f} "
            f"| {_cell(t['collect_vs_torchrl'])} | {t['learner_fps']:,.0f} "
            f"| {_cell(t['learner_vs_torchrl'])} | {t['learner_batches_per_s']:,.0f} "
            f"| {_cell(t['learner_batches_vs_torchrl'])} |"
            for t in bg_table
        ]
    md += [
        "",
        (
            f"_Python {versions['python']}, torch {versions['torch']}, tensordict "
            f"{versions['tensordict']}, gymnasium {versions['gymnasium']}, torchrl "
            f"{versions['torchrl']}, aiocollect {versions['aiocollect']}; {os.cpu_count()} CPUs, "
            f"torch.set_num_threads(1); sample batch {BATCH}; buffer rows: median of {repeats} "
            f"runs of ~{target_s:g} s; background rows: median of {bg_repeats} run(s) with "
            f"{bg_seconds:g} s windows._"
        ),
    ]
    log("\nMarkdown:\n")
    log("\n".join(md))

    elapsed, load_end = time.perf_counter() - t_start, bc._loadavg()
    log(
        f"\ntotal time {elapsed:.1f} s; load average (1 min) {load_start:.2f} at start, "
        f"{load_end:.2f} at end (this benchmark adds about 1-2)"
    )
    if args.json:
        settings = {
            "quick": quick,
            "repeats": repeats,
            "target_seconds": target_s,
            "bg_repeats": bg_repeats,
            "bg_seconds": bg_seconds,
            "batch": BATCH,
            "alpha": ALPHA,
            "beta": BETA,
            "num_workers": NUM_WORKERS,
            "payloads": {
                p.key: {"shape": list(p.td.shape), "frame_bytes": p.frame_bytes,
                        "capacity": p.capacity}
                for p in payloads
            },
        }  # fmt: skip
        result = {
            "versions": versions,
            "settings": settings,
            "load_avg": [load_start, load_end],
            "buffer_rows": op_table,
            "background_rows": bg_table,
            "notes": notes + bg_notes,
            "checks": [{"check": d, "ok": ok, "value": v} for d, ok, v in checks],
            "elapsed_s": elapsed,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, default=str)
    return 1 if args.strict and any_fail else 0


if __name__ == "__main__":  # the guard matters: spawned workers re-import this module
    sys.exit(main())
