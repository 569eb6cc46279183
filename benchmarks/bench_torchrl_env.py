#!/usr/bin/env python
"""aiocollect beside TorchRL on a TorchRL env: the drop-in's speed, in one process and with 2 workers.

Workload: ``TransformedEnv(GymEnv("Pendulum-v1"), Compose(DoubleToFloat(), StepCounter(200),
RewardSum()))`` and a deterministic 64-64 MLP ``TensorDictModule`` policy, the same objects for
every row, ``torch.set_num_threads(1)``. Rows:

* bare loop: a hand-written TorchRL loop (``policy(td)``; ``env.step_and_maybe_reset(td)``;
  stack the steps), the floor any collector adds overhead to;
* TorchRL's ``Collector`` and aiocollect's ``SyncDataCollector`` (one process);
* TorchRL's ``MultiSyncCollector`` and aiocollect's ``MultiSyncDataCollector`` (2 workers,
  one env each);
* whole episodes (``trajs_per_batch``, ``traj_format="cat"``: ``frames_per_batch / 200``
  episodes of 200 steps per batch), one process: a hand-written loop that stacks each
  episode's steps when it ends, TorchRL's ``Collector`` and aiocollect's ``SyncDataCollector``.

Each pair is timed in alternation (ABBA rounds, after a warm-up batch), so a slow patch of a
shared machine hits both sides; the reported ratio is the median of the per-round ratios.

    PYTHONPATH=. python benchmarks/bench_torchrl_env.py            # about 3 minutes on 2 cores
    PYTHONPATH=. python benchmarks/bench_torchrl_env.py --quick    # smoke run: 2 rounds of 2 batches

See benchmarks/README.md for what each row means.
"""

from __future__ import annotations

import os
import sys
import time
import warnings
from typing import Any

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
import _workloads as wl
from _harness import Col, log

warnings.filterwarnings("ignore", category=DeprecationWarning)


def make_env() -> Any:
    from torchrl.envs import Compose, DoubleToFloat, GymEnv, RewardSum, StepCounter, TransformedEnv

    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(DoubleToFloat(), StepCounter(200), RewardSum()))


def make_policy() -> Any:
    """The benchmarks' 64-64 MLP, ``tanh(mlp(obs)) * 2``, the same weights every time."""
    from tensordict.nn import TensorDictModule

    return TensorDictModule(wl.seeded(wl.ContinuousPolicy, 3, 1), in_keys=["observation"], out_keys=["action"])


class BareLoop:
    """The hand-written loop, as an iterator of batches of ``fpb`` frames."""

    def __init__(self, fpb: int) -> None:
        self.env, self.policy, self.fpb = make_env(), make_policy(), fpb
        self.td = self.env.reset()

    def __iter__(self) -> BareLoop:
        return self

    def __next__(self) -> Any:
        steps = []
        with torch.no_grad():
            for _ in range(self.fpb):
                self.policy(self.td)
                out, self.td = self.env.step_and_maybe_reset(self.td)
                steps.append(out)
        return torch.stack(steps)

    def shutdown(self) -> None:
        self.env.close()


class BareEpisodes:
    """The hand-written loop of whole episodes: ``n`` of them per batch, concatenated."""

    def __init__(self, n: int) -> None:
        self.env, self.policy, self.n = make_env(), make_policy(), n
        self.td = self.env.reset()
        self.steps: list[Any] = []
        self.episodes: list[Any] = []

    def __iter__(self) -> BareEpisodes:
        return self

    def __next__(self) -> Any:
        with torch.no_grad():
            while len(self.episodes) < self.n:
                self.policy(self.td)
                out, self.td = self.env.step_and_maybe_reset(self.td)
                self.steps.append(out)
                if out["next", "done"].item():
                    self.episodes.append(torch.stack(self.steps))
                    self.steps = []
        batch, self.episodes = self.episodes[: self.n], self.episodes[self.n :]
        return torch.cat(batch)

    def shutdown(self) -> None:
        self.env.close()


EPISODE = 200  # StepCounter(200): Pendulum's episodes end there


def build(name: str, fpb: int) -> Any:
    import torchrl.collectors as trc

    import aiocollect

    policy = make_policy()
    if name == "bare":
        return BareLoop(fpb)
    if name == "torchrl":
        return trc.Collector(make_env, policy, frames_per_batch=fpb, total_frames=-1)
    if name == "aiocollect":
        return aiocollect.SyncDataCollector(make_env, policy, frames_per_batch=fpb, total_frames=-1)
    episodes = {"trajs_per_batch": max(1, fpb // EPISODE), "traj_format": "cat"}
    if name == "bare-episodes":
        return BareEpisodes(episodes["trajs_per_batch"])
    if name == "torchrl-episodes":
        return trc.Collector(make_env, policy, frames_per_batch=fpb, total_frames=-1, **episodes)
    if name == "aiocollect-episodes":
        return aiocollect.SyncDataCollector(make_env, policy, frames_per_batch=fpb, total_frames=-1, **episodes)
    if name == "torchrl-multi":
        return trc.MultiSyncCollector([make_env] * 2, policy, frames_per_batch=fpb, total_frames=-1)
    if name == "aiocollect-multi":
        return aiocollect.MultiSyncDataCollector([make_env] * 2, policy, frames_per_batch=fpb, total_frames=-1)
    raise ValueError(name)


def fps(it: Any, batches: int) -> float:
    """Frames per second over ``batches`` batches of a running collector."""
    start, frames = time.perf_counter(), 0
    for _ in range(batches):
        frames += next(it).numel()
    return frames / (time.perf_counter() - start)


def paired(a: str, b: str, fpb: int, rounds: int, batches: int) -> dict[str, Any]:
    """ABBA rounds of ``a`` and ``b`` (both built once, warmed up by one batch)."""
    ca, cb = build(a, fpb), build(b, fpb)
    ia, ib = iter(ca), iter(cb)
    try:
        next(ia), next(ib)
        fa, fb = h.abba(lambda: fps(ia, batches), lambda: fps(ib, batches), rounds)
    finally:
        for c in (ca, cb):
            c.shutdown()
    ratios = h.pair_ratios(fb, fa)
    return {"a": a, "b": b, "fps": {a: h.median(fa), b: h.median(fb)}, "runs": {a: fa, b: fb},
            "ratio": h.median(ratios), "ratios": ratios}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(__doc__, quick="smoke run: 2 ABBA rounds of 2 batches per pair", strict=False)
    ap.add_argument("--frames-per-batch", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=None, help="ABBA rounds per pair (default 4; 2 with --quick)")
    ap.add_argument(
        "--batches", type=int, default=None, help="batches timed per side and round (default 4; 2 with --quick)"
    )
    args = ap.parse_args(argv)
    rounds = args.rounds or (2 if args.quick else 4)
    batches = args.batches or (2 if args.quick else 4)
    torch.set_num_threads(1)
    run = h.Session("torch", "tensordict", "torchrl", "aiocollect")
    run.header(
        f"bench_torchrl_env: {'QUICK' if args.quick else 'full'} run, {rounds} ABBA rounds of {batches} batches "
        f"of {args.frames_per_batch} frames per side",
        "torch threads=1",
    )
    pairs: list[tuple[str, str, str]] = [
        ("one process: aiocollect / bare loop", "bare", "aiocollect"),
        ("one process: aiocollect / TorchRL", "torchrl", "aiocollect"),
        ("2 workers: aiocollect / TorchRL", "torchrl-multi", "aiocollect-multi"),
        ("whole episodes: aiocollect / bare loop", "bare-episodes", "aiocollect-episodes"),
        ("whole episodes: aiocollect / TorchRL", "torchrl-episodes", "aiocollect-episodes"),
    ]
    results = []
    for label, a, b in pairs:
        res = paired(a, b, args.frames_per_batch, rounds, batches)
        res["label"] = label
        results.append(res)
        log(f"{label:40s} {res['ratio']:5.2f}x   ({a} {res['fps'][a]:8.0f} fps, {b} {res['fps'][b]:8.0f} fps; "
            f"per round {', '.join(f'{r:.2f}' for r in res['ratios'])})")  # fmt: skip
    cols = [Col("pair", left=True), Col("ratio (median of rounds)", left=True), Col("frames/s", left=True)]
    rows = [
        [r["label"], f"{r['ratio']:.2f}x", f"{r['b']} {r['fps'][r['b']]:.0f}, {r['a']} {r['fps'][r['a']]:.0f}"]
        for r in results
    ]
    log("\n" + "\n".join(h.markdown_table(cols, rows)))
    run.footer()
    run.write_json(args.json, frames_per_batch=args.frames_per_batch, rounds=rounds, batches=batches, results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
