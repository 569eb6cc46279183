"""In-process measurement: batches timed as they arrive, rows run round robin, paired runs, heartbeats."""

from __future__ import annotations

import gc
import itertools
import math
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ._report import NAN, log, median, spread

T = TypeVar("T")


def batch_frames(batch: Any) -> int:
    """Frames in a collector's TensorDict or in a bare loop's dict of ``[T, N]`` tensors."""
    return batch.numel() if hasattr(batch, "numel") else int(batch["reward"].numel())


def batch_dones(batch: Any) -> int:
    """Episode ends in a batch: one reduction per batch, the same for every row."""
    return int(batch["done"].sum()) if isinstance(batch, dict) else int(batch.get(("next", "done")).sum())


@dataclass
class Run:
    """One timed run of a row."""

    first_s: float  # construction (or env factory call) -> first batch in hand
    fps: float  # steady state: frames after the first batch / (last batch - first batch)
    frames: int
    dones: int = 0  # episode ends seen: the rows of a workload should see alike
    cpu_fps: float = NAN  # the same frames per second of process CPU time (all threads)
    cpu_util: float = NAN  # process CPU seconds / wall seconds over the steady state
    close_s: float = NAN  # last batch in hand -> shut down
    leaked: list[str] = field(default_factory=list)
    gaps: list[tuple[int, float]] = field(default_factory=list)  # heartbeat (phase, gap s)


class BatchClock:
    """Stamps batches as they arrive; the clock starts when it is created."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.t_first = self.t_last = self.c_first = self.c_last = self.t_end = 0.0
        self.frames = self.first_frames = self.dones = 0

    def batch(self, batch: Any) -> None:
        self.t_last, self.c_last = time.perf_counter(), time.process_time()
        n = batch_frames(batch)
        if not self.frames:
            self.t_first, self.c_first, self.first_frames = self.t_last, self.c_last, n
        self.frames += n
        self.dones += batch_dones(batch)

    def close(self) -> None:
        """The collector is shut down: the end of its close time."""
        self.t_end = time.perf_counter()

    def run(self, **extra: Any) -> Run:
        after, wall, cpu = self.frames - self.first_frames, self.t_last - self.t_first, self.c_last - self.c_first
        return Run(
            self.t_first - self.t0,
            after / wall if wall > 0 else NAN,
            self.frames,
            self.dones,
            cpu_fps=after / cpu if cpu > 0 else NAN,
            cpu_util=cpu / wall if wall > 0 else NAN,
            close_s=self.t_end - self.t_last if self.t_end else NAN,
            **extra,
        )


def measure_iter(make: Callable[[], Iterable[Any]]) -> Run:
    """Time ``make()`` (which builds the collector) and its batches to the end of its shutdown."""
    gc.collect()
    clock = BatchClock()
    for batch in make():
        clock.batch(batch)
    clock.close()  # the loop ran the generator's shutdown code
    return clock.run()


def iter_shutdown(c: Any) -> Iterator[Any]:
    """Iterate ``c`` and call its ``shutdown()`` at the end, also on an error."""
    try:
        yield from c
    finally:
        c.shutdown()


@dataclass
class Row:
    """One row of an in-process table: what runs, and its timed runs."""

    group: str  # the workload's key
    name: str
    kind: str  # "bare", "aio", "torchrl", ...: each script's own vocabulary
    runner: Callable[[int], Run]  # total frames -> Run
    fpb: int  # frames per batch as the caller receives it
    role: str | None = None  # pairs a row with its counterpart of the other library
    procs: int = 0  # env processes (0: all in this process)
    runs: list[Run] = field(default_factory=list)
    cold: Run | None = None  # the first construction of the row in this process
    total: int = 0  # frames per timed run
    leaks: list[str] = field(default_factory=list)

    def med(self, attr: str) -> float:
        return median(getattr(r, attr) for r in self.runs)

    @property
    def fps(self) -> float:
        return self.med("fps")

    @property
    def first_ms(self) -> float:
        return self.med("first_s") * 1e3

    @property
    def cold_ms(self) -> float:
        return self.cold.first_s * 1e3 if self.cold else NAN

    @property
    def ep_len(self) -> float:
        frames, dones = sum(r.frames for r in self.runs), sum(r.dones for r in self.runs)
        return frames / dones if dones else math.inf

    @property
    def spread(self) -> float:
        return spread(r.fps for r in self.runs)


@dataclass
class Settings:
    repeats: int
    target_s: float  # approximate steady-state length of one timed run
    min_batches: int  # per timed run; the first batch is not part of frames/s
    warm_batches: int  # 0: no warmup run; runs have min_batches and the first one is the cold one
    max_batches: int = 400

    @classmethod
    def of_args(cls, args: Any) -> Settings:
        """The worker-process scripts' settings from `parser`'s options: 3 runs of about 1 s after
        a 3-batch warmup, or with ``--quick`` one run of at least 5 batches (about 0.3 s), cold."""
        quick = args.quick
        return cls(
            repeats=args.repeats or (1 if quick else 3),
            target_s=args.target_seconds or (0.3 if quick else 1.0),
            min_batches=5 if quick else 3,
            warm_batches=0 if quick else 3,
        )


def run_rows(
    rows: list[Row],
    st: Settings,
    after: Callable[[Row, Run], None] | None = None,
    detail: Callable[[Run], str] | None = None,
) -> None:
    """Warm up every row (its cold first batch; sizing its runs to about ``st.target_s``), then
    time them round robin, so that slow drift of the machine affects every row alike. ``after``
    runs after every run (a leak check), ``detail`` adds to each run's log line."""

    def once(row: Row, total: int) -> Run:
        r = row.runner(total)
        if after is not None:
            after(row, r)
        return r

    w = max((len(r.name) for r in rows), default=0)
    for row in rows:
        if not st.warm_batches:
            row.total = st.min_batches * row.fpb
            continue
        row.cold = once(row, st.warm_batches * row.fpb)
        # A one-batch warmup has no steady-state rate; its first batch gives a lower bound.
        fps = row.cold.fps if math.isfinite(row.cold.fps) else row.fpb / row.cold.first_s
        n = max(st.min_batches, min(st.max_batches, round(st.target_s * fps / row.fpb) + 1))
        row.total = n * row.fpb
        log(f"  warmup  {row.group:<10} {row.name:<{w}} cold first batch {row.cold_ms:6.0f} ms, {n} batches/run")
    for rep, row in round_robin(rows, st.repeats):
        r = once(row, row.total)
        row.runs.append(r)
        row.cold = row.cold or r
        head = f"  run {rep + 1}/{st.repeats} {row.group:<10} {row.name:<{w}}"
        log(f"{head} {r.fps:8.0f} frames/s  first {r.first_s * 1e3:5.0f} ms{detail(r) if detail else ''}")


def round_robin(rows: Sequence[T], repeats: int) -> Iterator[tuple[int, T]]:
    """``(repeat, row)``: every row once per repeat, in the rows' order, repeat after repeat.

    Timing the rows round robin (instead of all runs of one row, then the next) makes a slow
    drift of a shared machine's speed affect every row alike.

    Args:
        rows: what to run.
        repeats: how many times each row runs.

    Yields:
        The repeat (from 0) and the row.
    """
    for rep in range(repeats):
        for row in rows:
            yield rep, row


def abba_order(rounds: int) -> Iterator[tuple[int, int]]:
    """``(round, side)`` of two sides alternating: (0, 1) in even rounds, (1, 0) in odd ones.

    Each side runs first as often as second, so neither gains from what the other leaves warm
    (caches, the allocator) and a drift of the machine's speed hits both alike.

    Args:
        rounds: how many pairs.

    Yields:
        The round (from 0) and the side (0 or 1) to run next.
    """
    for i in range(rounds):
        for side in (0, 1) if i % 2 == 0 else (1, 0):
            yield i, side


def abba(a: Callable[[], float], b: Callable[[], float], rounds: int) -> tuple[list[float], list[float]]:
    """Call ``a`` and ``b`` once per round in `abba_order`.

    Args:
        a: one side (returns a measurement).
        b: the other side.
        rounds: how many pairs.

    Returns:
        The measurements of each side, in round order.
    """
    out: tuple[list[float], list[float]] = ([], [])
    for _, side in abba_order(rounds):
        out[side].append((a, b)[side]())
    return out


def call_runner(fn: Callable[[], Any]) -> Callable[[int], float]:
    """A runner that calls ``fn`` ``n`` times and returns the seconds that took.

    Args:
        fn: one operation (a buffer's ``extend``, say), its arguments bound.

    Returns:
        ``n -> seconds``.
    """

    def run(n: int) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return time.perf_counter() - t

    return run


def async_call_runner(afn: Callable[[], Awaitable[Any]]) -> Callable[[int], float]:
    """`call_runner` for a coroutine function: each run is one ``anyio.run``.

    The clock starts inside the event loop, so creating the loop is not counted.

    Args:
        afn: one operation returning an awaitable, its arguments bound.

    Returns:
        ``n -> seconds`` of the ``n`` awaits.
    """

    def run(n: int) -> float:
        import anyio

        async def main() -> float:
            t = time.perf_counter()
            for _ in range(n):
                await afn()
            return time.perf_counter() - t

        return float(anyio.run(main))

    return run


def calibrate_calls(runner: Callable[[int], float], target_s: float, min_calls: int = 3) -> int:
    """Warm a call runner up and return how many calls make a run last about ``target_s``.

    The call count grows 4x at a time until a run takes 30 ms, long enough for the clock's
    resolution not to matter; those runs are the warmup.

    Args:
        runner: ``n -> seconds`` (see `call_runner`).
        target_s: the wanted length of one timed run.
        min_calls: the fewest calls per run.

    Returns:
        Calls per timed run.
    """
    k, dt = 1, 0.0
    while k < 100_000:
        dt = runner(k)
        if dt >= 0.03:
            break
        k *= 4
    return max(min_calls, math.ceil(target_s * k / max(dt, 1e-9)))


def timed(fn: Callable[[], Any]) -> float:
    """Seconds one call of ``fn`` takes."""
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


class Heartbeat:
    """A task that sleeps ``period`` in a loop on an event loop and stamps every wakeup: how late
    the loop runs its tasks. Start it with ``task_group.start_soon(hb.run)``, end it with `stop`."""

    def __init__(self, period: float = 0.001) -> None:
        self.period, self.stamps, self._stop = period, [time.perf_counter()], False

    async def run(self) -> None:
        import anyio

        while not self._stop:
            await anyio.sleep(self.period)
            self.stamps.append(time.perf_counter())

    def stop(self) -> None:
        self._stop = True

    def gaps(self, since: float = -math.inf) -> list[float]:
        """Gaps between wakeups that ended after ``since``, in seconds."""
        return [b - a for a, b in itertools.pairwise(self.stamps) if b > since]

    def phased(self, t0: float, t_first: float, t_last: float) -> list[tuple[int, float]]:
        """(phase, gap) from ``t0`` on: 0 startup (to the first batch), 1 steady, 2 teardown."""
        pairs = itertools.pairwise(self.stamps)
        return [(0 if b <= t_first else 1 if b <= t_last else 2, b - a) for a, b in pairs if b > t0]


async def idle_gaps(seconds: float = 0.3) -> list[float]:
    """Heartbeat gaps of an otherwise idle event loop, for ``seconds``: the reference."""
    import anyio

    hb = Heartbeat()
    end = time.perf_counter() + seconds
    while hb.stamps[-1] < end:
        await anyio.sleep(hb.period)
        hb.stamps.append(time.perf_counter())
    return hb.gaps()
