"""The collectors with the policy on a GPU, beside TorchRL's, and the cost of moving batches there.

Run on a GPU machine (``tools/device/check.sh`` runs it there); ``--device cpu`` runs the
same rows on the host, to check the script itself. Rows, all in one process, round robin:

* in process, CartPole x8 (``SyncVectorEnv``, SAME_STEP), the benchmarks' 64-64 MLP on the
  device: aiocollect's ``SyncDataCollector(policy_device=dev)``, with ``storing_device=dev``
  too, and TorchRL's collector with the same devices;
* worker processes, 2 x CartPole x8, the policy on the device in each worker, batches stored
  on the device: aiocollect's ``MultiSyncDataCollector`` and TorchRL's;
* the cost per batch of delivering batches on the device: aiocollect's in-process collector
  with ``storing_device=dev`` against the same without it, and, for scale, a plain
  ``batch.to(dev, non_blocking=True)`` (then a synchronize) of a batch of the same bytes.

    python benchmarks/bench_cuda.py [--quick] [--device cuda] [--json PATH]
    python benchmarks/bench_cuda.py --paired 30   # bare loop, stored on the host, on the device
    python benchmarks/bench_cuda.py --write-out   # a batch's write-out to the device, alone

``--write-out`` times the in-process collector's write-out of a batch to the device alone
(CartPole x8 and an env with Atari-sized pixel observations), beside a strided ``copy_`` and a
plain ``to(dev, non_blocking=True)`` of the same bytes.

``--paired N`` runs only the in-process sides, in one process, one batch of each per round (the
order turning each round) for N rounds: the bare loop with the policy on the device (pinned
observation rows, ``non_blocking`` to the device, ``.cpu()`` back: the tightest honest loop),
and the collector storing on the host and on the device. Rows run one after the other can
differ by the GPU's clocks alone. ``--single SIDE`` runs one side alone, for a sampling
profiler.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _harness as h
import _workloads as wl
import gymnasium as gym
import numpy as np
import torch

import aiocollect

FPB = 800
WORKERS = 2


def env8() -> Any:
    return wl.make_vec("CartPole-v1", 8)


def aio_in_process(dev: str, store: bool) -> Callable[[int], h.Run]:
    def run(total: int) -> h.Run:
        policy = wl.DiscretePolicy(4, 2).to(dev)
        kw = {"storing_device": dev} if store else {}
        c = aiocollect.SyncDataCollector(env8, policy, frames_per_batch=FPB, total_frames=total, policy_device=dev,
                                         **kw)  # fmt: skip
        return h.measure_iter(lambda: h.iter_shutdown(c))

    return run


def aio_workers(dev: str) -> Callable[[int], h.Run]:
    def run(total: int) -> h.Run:
        policy = wl.DiscretePolicy(4, 2).to(dev)
        c = aiocollect.MultiSyncDataCollector([env8] * WORKERS, policy, frames_per_batch=FPB, total_frames=total,
                                              policy_device=dev, storing_device=dev)  # fmt: skip
        return h.measure_iter(lambda: h.iter_shutdown(c))

    return run


def torchrl_rows(dev: str) -> list[h.Row]:
    import torchrl.collectors as trc
    from tensordict.nn import TensorDictModule

    sync_cls, sync_name = h.first_attr(trc, ("Collector", "SyncDataCollector"))
    multi_cls, multi_name = h.first_attr(trc, ("MultiSyncCollector", "MultiSyncDataCollector"))
    env_fn = functools.partial(wl.trl_vec, "CartPole-v1", 8)

    def policy() -> Any:
        return TensorDictModule(wl.DiscretePolicy(4, 2), in_keys=["observation"], out_keys=["action"]).to(dev)

    def sync(store: bool) -> Callable[[int], h.Run]:
        def run(total: int) -> h.Run:
            kw = {"storing_device": dev} if store else {}
            c = sync_cls(env_fn, policy(), frames_per_batch=FPB, total_frames=total, policy_device=dev,
                         env_device="cpu", **kw)  # fmt: skip
            return h.measure_iter(lambda: h.iter_shutdown(c))

        return run

    def multi(total: int) -> h.Run:
        c = multi_cls([env_fn] * WORKERS, policy(), frames_per_batch=FPB, total_frames=total, policy_device=dev,
                      env_device="cpu", storing_device=dev)  # fmt: skip
        return h.measure_iter(lambda: h.iter_shutdown(c))

    return [
        h.Row("inproc", f"TorchRL {sync_name}, policy on {dev}", "torchrl", sync(False), FPB, role="policy"),
        h.Row("inproc", f"TorchRL {sync_name}, policy+storing on {dev}", "torchrl", sync(True), FPB, role="storing"),
        h.Row("workers", f"TorchRL {multi_name}, {WORKERS} workers", "torchrl", multi, FPB, role="workers",
              procs=WORKERS),
    ]  # fmt: skip


def plain_move_ms(dev: str, repeats: int = 50) -> float:
    """Milliseconds to move one batch's bytes to ``dev`` with ``to(non_blocking=True)``, then wait."""
    c = aiocollect.SyncDataCollector(env8, wl.DiscretePolicy(4, 2), frames_per_batch=FPB, total_frames=FPB)
    (batch,) = list(h.iter_shutdown(c))
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        batch.to(dev, non_blocking=True)
        sync()
        times.append(time.perf_counter() - t)
    return h.median(times) * 1e3


SIDES = ("bare loop", "stored on the host", "stored on the device")


def _sides(dev: str) -> dict[str, Callable[[], Any]]:
    """The three in-process ways to collect with the policy on ``dev``, as batch iterators."""
    policy = wl.DiscretePolicy(4, 2).to(dev)

    def make(store: bool) -> Any:
        kw = {"storing_device": dev} if store else {}
        c = aiocollect.SyncDataCollector(env8, policy, frames_per_batch=FPB, total_frames=-1, policy_device=dev, **kw)
        return h.iter_shutdown(c)

    return {
        SIDES[0]: lambda: wl.bare_loop(env8, policy, FPB, 10**15, device=dev),
        SIDES[1]: lambda: make(False),
        SIDES[2]: lambda: make(True),
    }


def paired(dev: str, rounds: int) -> dict[str, list[float]]:
    """Seconds per batch of each side, one batch of each per round, the order turning each round.

    All three run side by side in one process from the start, so a drift of the GPU's clocks
    or of the machine's speed hits them alike.
    """
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    its = {name: make() for name, make in _sides(dev).items()}
    try:
        for it in its.values():
            for _ in range(3):  # warm-up: allocations, first calls
                next(it)
        times: dict[str, list[float]] = {name: [] for name in its}
        names = list(its)
        for i in range(rounds):
            for name in names[i % 3 :] + names[: i % 3]:
                t = time.perf_counter()
                next(its[name])
                sync()  # the device batch's copies are done, not only queued
                times[name].append(time.perf_counter() - t)
        return times
    finally:
        for it in its.values():
            it.close()


def single(dev: str, side: str, batches: int) -> int:
    """Collect ``batches`` batches of one side only (for a sampling profiler)."""
    it = _sides(dev)[side]()
    try:
        for _ in range(batches):
            next(it)
    finally:
        it.close()
    return 0


def report_paired(dev: str, rounds: int, json_path: str | None) -> int:
    times = paired(dev, rounds)
    ms = {name: h.median(t) * 1e3 for name, t in times.items()}
    plain = plain_move_ms(dev)
    h.log(f"paired, {rounds} rounds (one batch of each side, order turning), policy on {dev}, {FPB} frames per batch:")
    for name in SIDES:
        x = h.median(h.pair_ratios(times[SIDES[0]], times[name]))
        h.log(f"  {name:>22}: {ms[name]:6.2f} ms/batch ({FPB / ms[name] * 1e3:8,.0f} frames/s), x bare loop {x:.2f}")
    h.log(f"  cost per batch of storing on {dev}: {ms[SIDES[2]] - ms[SIDES[1]]:.2f} ms; a plain to({dev!r}, "
          f"non_blocking=True) of the same bytes: {plain:.2f} ms")  # fmt: skip
    if json_path:
        import json

        with open(json_path, "w") as f:
            json.dump({"rounds": rounds, "ms_per_batch": ms, "plain_move_ms": plain}, f)
    return 0


class PixelEnv(gym.Env):
    """Atari-sized observations (4 stacked 84x84 uint8 frames), nearly free to step."""

    observation_space = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def __init__(self) -> None:
        self.frame, self.t = np.zeros((4, 84, 84), np.uint8), 0

    def reset(self, *, seed: Any = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t = 0
        return self.frame, {}

    def step(self, action: Any) -> Any:
        self.t += 1
        self.frame[:, 0, 0] = self.t % 256
        return self.frame, 1.0, False, self.t >= 50, {}


def pixels8() -> Any:
    return gym.vector.SyncVectorEnv([PixelEnv] * 8, autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)


def write_out(dev: str, repeats: int) -> int:
    """The in-process collector's write-out alone (time-major host storage to a [B, T] batch on ``dev``).

    Three ways to move the same storage, timed in turn: the collector's own write-out
    (``storing_device=dev``), a strided ``copy_`` of each entry (the host gathers it into a
    pageable temporary first), and a plain ``to(dev, non_blocking=True)`` of the contiguous
    entries, with no change of layout (the floor).
    """
    h.log(f"write-out to {dev}, {FPB} frames per batch (8 envs x {FPB // 8} steps), median of {repeats}, ms:")
    for label, make in (("CartPole x8", env8), ("pixels 4x84x84 uint8 x8", pixels8)):
        c = aiocollect.SyncDataCollector(make, None, frames_per_batch=FPB, total_frames=-1, storing_device=dev)
        it = h.iter_shutdown(c)
        try:
            next(it)  # allocates the storage (pinned when batches go to a GPU)
            rollout = c._async._rollout  # the benchmark reaches in: the write-out alone, not the steps
            mb, times = _time_ways(rollout, dev, repeats)
            cells = ", ".join(f"{name} {h.median(t) * 1e3:.3f}" for name, t in times.items())
            h.log(f"  {label} ({mb:.2f} MB): {cells}")
        finally:
            it.close()
    return 0


def _time_ways(rollout: Any, dev: str, repeats: int) -> tuple[float, dict[str, list[float]]]:
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    kept = rollout._kept()
    out = {k: torch.empty(shape, dtype=dtype, device=dev) for k, shape, dtype in rollout.output_layout()}

    def strided() -> None:
        for k, v in kept:
            out[k].copy_(v.movedim(0, rollout.nb))

    def plain() -> None:
        for _, v in kept:
            v.to(dev, non_blocking=True)

    ways = {"aiocollect write-out": lambda: rollout._write_out(out, rollout.T), "strided copy_": strided,
            "plain to(non_blocking)": plain}  # fmt: skip
    times: dict[str, list[float]] = {name: [] for name in ways}
    for i, name in h.round_robin(list(ways), repeats + 3):
        sync()
        took = h.timed(lambda: (ways[name](), sync()))  # noqa: B023 (called at once)
        if i >= 3:  # the first rounds warm the allocators up
            times[name].append(took)
    return sum(v.numel() * v.element_size() for _, v in kept) / 2**20, times


def main() -> int:
    ap = h.parser(__doc__, quick="one short run per row", repeats="timed runs per row (default 3)",
                  no_torchrl="leave TorchRL's rows out", strict=False)  # fmt: skip
    ap.add_argument("--device", default="cuda", help="where the policy runs (default cuda)")
    ap.add_argument("--paired", type=int, metavar="N", help="only the in-process sides, N rounds in one process")
    ap.add_argument("--single", choices=SIDES, help="only this side, --batches batches (for a sampling profiler)")
    ap.add_argument("--batches", type=int, default=60, help="batches for --single (default 60)")
    ap.add_argument("--write-out", action="store_true", help="only the write-out of a batch to the device, timed alone")
    args = ap.parse_args()
    dev = args.device
    if dev.startswith("cuda") and not torch.cuda.is_available():
        print("bench_cuda: no CUDA device here; pass --device cpu to check the script on the host")
        return 2
    torch.set_num_threads(1)
    if args.single:
        return single(dev, args.single, args.batches)
    if args.paired:
        return report_paired(dev, args.paired, args.json)
    if args.write_out:
        return write_out(dev, args.repeats or 30)
    session = h.Session("torch", "tensordict", "gymnasium", "torchrl", "aiocollect")
    card = torch.cuda.get_device_name(0) if dev.startswith("cuda") else "no GPU (host run)"
    session.header(f"bench_cuda: policy on {dev}, frames_per_batch={FPB}", card)
    rows = [
        h.Row("inproc", f"aiocollect SyncDataCollector, policy on {dev}", "aio", aio_in_process(dev, False), FPB,
              role="policy"),
        h.Row("inproc", f"aiocollect SyncDataCollector, policy+storing on {dev}", "aio", aio_in_process(dev, True),
              FPB, role="storing"),
        h.Row("workers", f"aiocollect MultiSyncDataCollector, {WORKERS} workers", "aio", aio_workers(dev), FPB,
              role="workers", procs=WORKERS),
    ]  # fmt: skip
    note = h.torchrl_note(args.no_torchrl, import_it=True)
    if note is None:
        rows += torchrl_rows(dev)
    else:
        h.log(f"  TorchRL rows left out: {note}")
    repeats = 1 if args.quick else (args.repeats or 3)
    st = h.Settings(repeats=repeats, target_s=0.5 if args.quick else 2.0, min_batches=3, warm_batches=2)
    h.run_rows(rows, st)

    def other(row: h.Row) -> h.Row | None:
        return next((r for r in rows if r.role == row.role and r.kind != row.kind), None)

    records = []
    for row in rows:
        peer = other(row) if row.kind == "aio" else None
        records.append({"name": row.name, "fps": row.fps, "first_ms": row.first_ms,
                        "x_torchrl": h.div(row.fps, peer.fps) if peer else h.NAN})  # fmt: skip
    cols = [
        h.Col("row", lambda r: r["name"]),
        h.Col("frames/s", lambda r: h.fmt_n(r["fps"], sep=True)),
        h.Col("first batch (ms)", lambda r: h.fmt_ms(r["first_ms"] / 1e3)),
        h.Col("x TorchRL", lambda r: h.fmt_x(r["x_torchrl"])),
    ]
    h.log("")
    for line in h.console_table(cols, records):
        h.log(line)
    plain, store, bare = plain_move_ms(dev), rows[1], rows[0]
    per_batch = (FPB / store.fps - FPB / bare.fps) * 1e3
    h.log(f"\ncost per batch of storing on {dev}: {per_batch:.2f} ms (in-process collector, storing_device={dev} "
          f"against none); a plain to({dev!r}, non_blocking=True) of the same bytes: {plain:.2f} ms")  # fmt: skip
    session.markdown(h.markdown_table(cols, records), f"; {card}")
    session.footer()
    session.write_json(args.json, rows=records, store_cost_ms=per_batch, plain_move_ms=plain, card=card)
    return 0


if __name__ == "__main__":
    sys.exit(main())
