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

import functools
import gc
import math
import multiprocessing
import os
import sys
import threading
import time
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn

import aiocollect
import aiocollect.blocking

# The sibling modules, from any cwd. Spawned workers re-import this module, and with it this
# path setup, so they can unpickle the policy and env factories of _workloads too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as h
import _workloads as wl
from _harness import Col, log

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
CARTPOLE8 = wl.CARTPOLE8  # bench_collect's CartPole x8: a SyncVectorEnv of 8, SAME_STEP autoreset
TRL_CARTPOLE8 = functools.partial(wl.trl_vec, "CartPole-v1", ENVS)  # TorchRL's fastest in-process setup


# --------------------------------------------------------------------------------------------
# Payloads
# --------------------------------------------------------------------------------------------


def cartpole_payload(policy: nn.Module) -> TensorDict:
    """One real [8, 100] batch, collected by aiocollect from seeded envs, as a dense unnamed
    TensorDict (aiocollect names the time dim; TorchRL's buffers do not expect names)."""

    async def collect() -> TensorDictBase:
        c = aiocollect.Collector(CARTPOLE8, policy, frames_per_batch=FPB, total_frames=FPB)
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
# TorchRL (nothing of TorchRL is imported at module level)
# --------------------------------------------------------------------------------------------


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

    single = h.first_attr(trc, ("Collector", "SyncDataCollector"))[0]  # 0.14 names first
    return single, h.first_attr(trc, ("MultiAsyncCollector", "MultiaSyncDataCollector"))[0]


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
        return h.median(self.runs)

    @property
    def fps(self) -> float:
        return self.cps * self.frames

    @property
    def spread(self) -> float:
        return h.spread(self.runs)


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
            run = h.call_runner(functools.partial(rb.extend, data))
            add("extend", name, kind, sampler, "direct", data.numel(), run)
            run = h.call_runner(functools.partial(rb.sample, BATCH))
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
             h.async_call_runner(part(arb.extend, flat))),
            ("extend", "blocking extend()", "aio", "blocking", flat.numel(),
             h.call_runner(part(brb.extend, flat))),
            ("extend", f"await extend() [{ENVS},T] batch", "aio_extra", "async", p.td.numel(),
             h.async_call_runner(part(arb.extend, p.td))),
            ("sample", "await sample()", "aio", "async", BATCH,
             h.async_call_runner(part(arb.sample, BATCH))),
            ("sample", "blocking sample()", "aio", "blocking", BATCH,
             h.call_runner(part(brb.sample, BATCH))),
            ("sample", "sample_nowait()", "aio", "nowait", BATCH,
             h.call_runner(part(brb.sample_nowait, BATCH))),
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


def run_op_rows(rows: list[OpRow], repeats: int, target_s: float) -> None:
    """Warm up and size every row, then time them round robin."""
    live = []
    for row in rows:
        try:
            row.calls = h.calibrate_calls(row.runner, target_s)
            live.append(row)
        except Exception as exc:  # reported; the other rows go on
            row.error = f"{type(exc).__name__}: {exc}"
            log(f"  ERROR   {row.op:<6} {row.name}: {row.error}")
    for rep, row in h.round_robin(live, repeats):
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
        return h.median(getattr(r, attr) for r in self.runs)

    @property
    def spread(self) -> float:
        return h.spread(r.collect_fps for r in self.runs)


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
            return rb, multi_cls([TRL_CARTPOLE8] * NUM_WORKERS, module, **kw)
        return rb, single_cls(TRL_CARTPOLE8, module, **kw)

    return run_blocking(make, _trl_frames, _sample, _trl_close, seconds, multi * NUM_WORKERS)


def aio_run(policy: nn.Module, seconds: float, multi: bool, sample: Callable = _sample) -> BgRun:
    def make() -> tuple[Any, Any]:
        # A multi-process collector makes the (not yet built) buffer's storage shared memory.
        rb = aiocollect.blocking.ReplayBuffer(BG_CAPACITY)
        kw = {"frames_per_batch": FPB, "total_frames": -1, "replay_buffer": rb}
        if multi:
            cls = aiocollect.MultiaSyncDataCollector
            return rb, cls(CARTPOLE8, policy, num_workers=NUM_WORKERS, **kw)
        return rb, aiocollect.SyncDataCollector(CARTPOLE8, policy, **kw)

    return run_blocking(make, _aio_frames, sample, _aio_close, seconds, multi * NUM_WORKERS)


def aio_async_run(policy: nn.Module, seconds: float) -> BgRun:
    async def main() -> BgRun:
        rb = aiocollect.ReplayBuffer(BG_CAPACITY)
        frames = functools.partial(_aio_frames, rb)
        t0 = time.perf_counter()
        try:
            c = aiocollect.Collector(CARTPOLE8, policy, frames_per_batch=FPB, total_frames=-1, replay_buffer=rb)
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
    single_cls, multi_cls = torchrl_collector_classes() if torchrl else (type(None), type(None))
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


def run_bg_rows(rows: list[BgRow], repeats: int, seconds: float, baseline: set[int]) -> list[str]:
    """Time the rows round robin (no warmup run: the first run of a row is its cold start).
    Returns notes on long-lived helpers that appeared (not counted as leaks)."""
    notes: list[str] = []
    seen: set[str] = set()
    for rep, row in h.round_robin(rows, repeats):
        try:
            r: BgRun | None = row.runner(seconds)
        except Exception as exc:  # reported; the other rows go on
            row.errors.append(f"{type(exc).__name__}: {exc}")
            log(f"  ERROR   {row.name}: {row.errors[-1]}")
            r = None
        left = h.wait_children_gone(3.0, baseline)
        _, helpers = h.live_children(baseline)
        if left:
            log(f"  WARNING: {row.name}: still alive after shutdown: {left}")
        for helper in sorted(set(helpers) - seen):
            seen.add(helper)
            notes.append(
                f"{helper} appeared during a run of {row.name}: a long-lived helper of multiprocessing or "
                "torch that serves for the process's lifetime, not counted as a leak"
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
# Main and the output tables (their columns: a heading and how a result record becomes the cell)
# --------------------------------------------------------------------------------------------

OP_COLUMNS = [
    Col("payload", "{payload}", 25, left=True),
    Col("op", "{op}", 6, left=True),
    Col("row", "{row}", 50, left=True),
    Col("calls/s", "{calls_per_s:.0f}", 8),
    Col("frames/s", "{frames_per_s:.0f}", 10),
    Col("us/call", "{us_per_call:.0f}", 7),
    Col("x TorchRL", h.ratio("vs_torchrl"), 9),
    Col("spread", lambda t: f"{t['spread'] * 100:.0f}%", 6),
]
OP_MARKDOWN = [
    Col("payload", "{payload}", left=True),
    Col("op", "{op}", left=True),
    Col("buffer, call", "{row}", left=True),
    Col("calls/s", "{calls_per_s:,.0f}"),
    Col("frames/s", "{frames_per_s:,.0f}"),
    Col("vs TorchRL", h.ratio("vs_torchrl", "-")),
]
BG_COLUMNS = [
    Col("row", "{row}", 45, left=True),
    Col("procs", "{procs}", 5),
    Col("1st write", "{first_write_ms:.0f}ms", 9),
    Col("collect", "{collect_fps:.0f}", 8),
    Col("x TorchRL", h.ratio("collect_vs_torchrl"), 9),
    Col("+learner", "{learner_fps:.0f}", 8),
    Col("x TorchRL", h.ratio("learner_vs_torchrl"), 9),
    Col("batch/s", "{learner_batches_per_s:.0f}", 7),
    Col("x TorchRL", h.ratio("learner_batches_vs_torchrl"), 9),
    Col("close", "{close_ms:.0f}ms", 6),
    Col("spread", lambda t: f"{t['spread'] * 100:.0f}%", 6),
]
BG_MARKDOWN = [
    Col("background collection, CartPole-v1 x8", "{row}", left=True),
    Col("env procs", "{procs}"),
    Col("first write (ms)", "{first_write_ms:,.0f}"),
    Col("collect only (frames/s)", "{collect_fps:,.0f}"),
    Col("vs TorchRL", h.ratio("collect_vs_torchrl", "-")),
    Col("+ learner (frames/s)", "{learner_fps:,.0f}"),
    Col("vs TorchRL", h.ratio("learner_vs_torchrl", "-")),
    Col("learner (batches/s)", "{learner_batches_per_s:,.0f}"),
    Col("vs TorchRL", h.ratio("learner_batches_vs_torchrl", "-")),
]


def parse_args(argv: list[str] | None) -> Any:
    ap = h.parser(
        __doc__,
        quick="CI smoke run (under a minute), noisy",
        repeats="timed runs per buffer row (default 5, quick 2)",
        target_seconds="approximate length of one timed buffer run (default 0.25, --quick 0.1)",
        no_torchrl="skip the TorchRL rows",
    )
    ap.add_argument(
        "--bg-repeats", type=int, default=None, help="runs per background-collection row (default 3, --quick 1)"
    )
    ap.add_argument(
        "--bg-seconds",
        type=float,
        default=None,
        help="length of each measurement window of a background run (default 4, --quick 1.5)",
    )
    ap.add_argument(
        "--payload", action="append", choices=["cartpole", "atari"], help="run only this payload (repeatable)"
    )
    ap.add_argument("--no-background", action="store_true", help="skip background collection")
    ap.add_argument("--no-multiprocess", action="store_true", help="skip the multi-process background rows")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    repeats = args.repeats or (2 if quick else 5)
    target_s = args.target_seconds or (0.1 if quick else 0.25)
    bg_repeats = args.bg_repeats or (1 if quick else 3)
    bg_seconds = args.bg_seconds or (1.5 if quick else 4.0)
    # What TorchRL selects for itself in a fresh script, fixed before any process starts, so
    # that TorchRL's multi-process rows do not silently fork (aiocollect always spawns).
    multiprocessing.set_start_method("spawn", force=True)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    baseline_threads = {t.ident for t in threading.enumerate() if t.ident is not None}

    trl_missing = h.torchrl_note(args.no_torchrl, import_it=True)
    prio_missing = torchrl_prioritized_missing() if trl_missing is None else None
    run = h.Session("torch", "tensordict", "gymnasium", "anyio", "torchrl", aiocollect=aiocollect.__version__)
    if trl_missing is not None:
        run.versions["torchrl"] = "not used"
    notes = [f"NOTE: TorchRL rows skipped ({trl_missing})"] if trl_missing else []
    notes += [f"NOTE: TorchRL's prioritized rows skipped: {prio_missing}"] if prio_missing else []
    run.header(
        f"bench_buffer: {'QUICK (no informational rows)' if quick else 'full'} run; buffer rows: "
        f"{repeats} timed runs of ~{target_s:g} s after a warmup, sample batch {BATCH}; "
        f"background rows: {bg_repeats} run(s), windows of {bg_seconds:g} s",
        f"torch threads={torch.get_num_threads()}",
        *notes,
    )

    policy = wl.seeded(wl.DiscretePolicy, 4, 2)
    payloads = []
    chosen = args.payload or ["cartpole", "atari"]
    if "cartpole" in chosen:
        td = cartpole_payload(policy)
        payloads.append(Payload("cartpole", f"CartPole-v1 [{ENVS}, 100]", td, 100_000))
    if "atari" in chosen:
        payloads.append(Payload("atari", "Atari-like 84x84 [8, 32]", atari_payload(), 20_000))

    # ---------------------------------------------------------------- part 1: buffers
    op_rows: list[OpRow] = []
    notes = []
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
        run_op_rows([r for r in rows if r.op == "extend"], repeats, target_s)
        randomize_priorities(bufs, p.capacity)  # after the extends, which reset them to the max
        run_op_rows([r for r in rows if r.op == "sample"], repeats, target_s)
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
        bg_notes = run_bg_rows(bg_rows, bg_repeats, bg_seconds, baseline_threads)
        gc.unfreeze()
        log(f"  ({time.perf_counter() - phase:.1f} s)")

    payload_titles = {p.key: p.title for p in payloads}
    op_table = [op_result(r, ref_op(op_rows, r.payload, r.op, r.sampler), payload_titles) for r in op_rows]
    bg_table = [bg_result(r, ref_bg(bg_rows, r.role)) for r in bg_rows]
    checks = h.Checks()
    targets(checks, payloads, op_rows, bg_rows, trl_missing, prio_missing)
    if bg_rows:
        gc.collect()
        left = h.wait_children_gone(5.0, baseline_threads)
        leaked = sorted({r.name for r in bg_rows for x in r.runs if x.leaks})
        clean = not left and not leaked
        value = "none" if clean else f"alive now: {left}; rows that left some: {leaked}"
        checks.add("no collector process or thread left alive after shutdown", clean, value)

    report(op_table, bg_table, repeats, bg_repeats, bg_seconds, notes, bg_notes)
    checks.report()
    markdown(op_table, bg_table, run, repeats, target_s, bg_repeats, bg_seconds)
    run.footer("this benchmark adds about 1-2")
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
            p.key: {"shape": list(p.td.shape), "frame_bytes": p.frame_bytes, "capacity": p.capacity} for p in payloads
        },
    }
    run.write_json(
        args.json,
        settings=settings,
        buffer_rows=op_table,
        background_rows=bg_table,
        notes=notes + bg_notes,
        checks=checks.as_json(),
    )
    return checks.exit_code(args.strict)


def ref_op(op_rows: list[OpRow], payload: str, op: str, sampler: str) -> OpRow | None:
    """TorchRL's plain buffer with the same sampler: the reference of a buffer row."""
    return h.find(op_rows, payload=payload, op=op, sampler=sampler, kind="torchrl")


def ref_bg(bg_rows: list[BgRow], role: str) -> BgRow | None:
    """TorchRL's collector of the same role: the reference of a background row."""
    return h.find(bg_rows, kind="torchrl", role=role)


def op_result(r: OpRow, ref: OpRow | None, titles: dict[str, str]) -> dict[str, Any]:
    return {
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
        "vs_torchrl": h.div(r.fps, ref.fps) if ref is not None and ref.runs else math.nan,
        "spread": r.spread,
        "runs_calls_per_s": r.runs,
        "error": r.error,
    }


def bg_result(r: BgRow, ref: BgRow | None) -> dict[str, Any]:
    def ratio(attr: str) -> float:
        return h.div(r.med(attr), ref and ref.med(attr))

    return {
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


def targets(
    checks: h.Checks,
    payloads: list[Payload],
    op_rows: list[OpRow],
    bg_rows: list[BgRow],
    trl_missing: str | None,
    prio_missing: str | None,
) -> None:
    need = TARGETS["sample_vs_torchrl"]
    for p in payloads:
        for sampler in ("uniform", "prioritized"):
            ref = ref_op(op_rows, p.key, "sample", sampler)
            for way in ("nowait", "async"):
                row = h.find(op_rows, payload=p.key, op="sample", sampler=sampler, way=way, kind="aio")
                if row is None:
                    continue
                desc = f"{p.title}: {row.name} >= {need:g}x TorchRL {sampler} sample"
                if ref is None or not ref.runs:
                    why = trl_missing or (prio_missing if sampler == "prioritized" else None)
                    why = why or (ref.error if ref is not None else "not run")
                    checks.add(desc, None, f"TorchRL row not run: {str(why)[:70]}")
                elif not row.runs:
                    checks.add(desc, False, f"aiocollect row failed: {row.error}")
                else:
                    x = row.cps / ref.cps
                    checks.add(desc, x >= need, f"{x:.2f}x ({row.cps:.0f} vs {ref.cps:.0f} batches/s, {ref.name})")
    need = TARGETS["background_vs_torchrl"]
    for r in bg_rows:
        if r.kind != "aio":
            continue
        bg_ref = ref_bg(bg_rows, r.role)
        for attr, label in (("collect_fps", "collect only"), ("learner_fps", "+ learner")):
            desc = f"background, {label}: {r.name} >= {need:g}x TorchRL frames/s written"
            if bg_ref is None or not bg_ref.runs:
                why = "not run" if bg_ref is None else f"failed: {bg_ref.errors}"
                checks.add(desc, None, f"TorchRL counterpart {why}")
            elif not r.runs:
                checks.add(desc, False, f"failed: {r.errors}")
            else:
                x = r.med(attr) / bg_ref.med(attr)
                val = f"{x:.2f}x ({r.med(attr):.0f} vs {bg_ref.med(attr):.0f} frames/s)"
                if attr == "learner_fps":
                    bps, ref_bps = r.med("learner_bps"), bg_ref.med("learner_bps")
                    val += f"; learner {bps:.0f} vs {ref_bps:.0f} batches/s ({bps / ref_bps:.2f}x)"
                checks.add(desc, x >= need, val)


def report(
    op_table: list[dict[str, Any]],
    bg_table: list[dict[str, Any]],
    repeats: int,
    bg_repeats: int,
    bg_seconds: float,
    notes: list[str],
    bg_notes: list[str],
) -> None:
    log("\n" + "=" * 122)
    log(
        f"RESULTS (1/2): extend and sample, median of {repeats} timed runs after a warmup; "
        f"x TorchRL: frames/s vs TorchRL's plain buffer with the same sampler"
    )
    rows = [[t["payload"], t["op"], t["row"], f"ERROR {t['error'][:60]}"] if t["error"] else t for t in op_table]
    for line in h.console_table(OP_COLUMNS, rows):
        log(line)
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
        for line in h.console_table(BG_COLUMNS, bg_table):
            log(line)
        log("  procs: env worker processes (0 = in this process). 1st write: construction to the")
        log("  first frames in the buffer. collect: frames written per second, nobody sampling.")
        log("  +learner: the same while the main thread (async row: a task) samples batches of")
        log(f"  {BATCH} in a loop; batch/s: its batches per second. x TorchRL: vs TorchRL's")
        log("  collector of the same role. close: shutdown. spread: of the collect column.")
        for n in bg_notes:
            log(f"  NOTE: {n}")


def markdown(
    op_table: list[dict[str, Any]],
    bg_table: list[dict[str, Any]],
    run: h.Session,
    repeats: int,
    target_s: float,
    bg_repeats: int,
    bg_seconds: float,
) -> None:
    md = h.markdown_table(OP_MARKDOWN, [t for t in op_table if not t["error"]])
    if bg_table:
        md += ["", *h.markdown_table(BG_MARKDOWN, bg_table)]
    run.markdown(
        md,
        f", torch.set_num_threads(1); sample batch {BATCH}; buffer rows: median of {repeats} runs of "
        f"~{target_s:g} s; background rows: median of {bg_repeats} run(s) with {bg_seconds:g} s windows",
    )


if __name__ == "__main__":  # the guard matters: spawned workers re-import this module
    sys.exit(main())
