"""aiocollect beside TorchRL on a TorchRL env: the drop-in's speed, in one process and with 2 workers.

Workload: ``TransformedEnv(GymEnv("Pendulum-v1"), Compose(DoubleToFloat(), StepCounter(200),
RewardSum()))`` and a deterministic 64-64 MLP ``TensorDictModule`` policy, the same objects for
every row, ``torch.set_num_threads(1)``. Rows:

* bare loop: a hand-written TorchRL loop (``policy(td)``; ``env.step_and_maybe_reset(td)``;
  stack the steps), the floor any collector adds overhead to;
* TorchRL's ``Collector`` and aiocollect's ``SyncDataCollector`` (one process);
* TorchRL's ``MultiSyncCollector`` and aiocollect's ``MultiSyncDataCollector`` (2 workers,
  one env each).

Each pair is timed in alternation (ABBA rounds, after a warm-up batch), so a slow patch of a
shared machine hits both sides; the reported ratio is the median of the per-round ratios.

    PYTHONPATH=. python benchmarks/bench_torchrl_env.py            # about 2 minutes on 2 cores
    PYTHONPATH=. python benchmarks/bench_torchrl_env.py --rounds 2 --batches 3   # smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from typing import Any

import torch

warnings.filterwarnings("ignore", category=DeprecationWarning)


def make_env() -> Any:
    from torchrl.envs import Compose, DoubleToFloat, GymEnv, RewardSum, StepCounter, TransformedEnv

    return TransformedEnv(GymEnv("Pendulum-v1"), Compose(DoubleToFloat(), StepCounter(200), RewardSum()))


class MLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(3, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)
        )

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).tanh() * 2


def make_policy() -> Any:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(MLP(), in_keys=["observation"], out_keys=["action"])


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
        runs: dict[str, list[float]] = {a: [], b: []}
        for r in range(rounds):
            order = (a, b) if r % 2 == 0 else (b, a)
            for name in order:
                runs[name].append(fps(ia if name == a else ib, batches))
    finally:
        for c in (ca, cb):
            c.shutdown()
    ratios = [y / x for x, y in zip(runs[a], runs[b], strict=True)]
    return {"a": a, "b": b, "fps": {k: statistics.median(v) for k, v in runs.items()}, "runs": runs,
            "ratio": statistics.median(ratios), "ratios": ratios}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames-per-batch", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=4, help="ABBA rounds per pair (default 4)")
    parser.add_argument("--batches", type=int, default=4, help="batches timed per side and round (default 4)")
    parser.add_argument("--json", help="also write every number to this file")
    args = parser.parse_args()
    torch.set_num_threads(1)
    pairs: list[tuple[str, str, str]] = [
        ("one process: aiocollect / bare loop", "bare", "aiocollect"),
        ("one process: aiocollect / TorchRL", "torchrl", "aiocollect"),
        ("2 workers: aiocollect / TorchRL", "torchrl-multi", "aiocollect-multi"),
    ]
    results = []
    for label, a, b in pairs:
        res = paired(a, b, args.frames_per_batch, args.rounds, args.batches)
        res["label"] = label
        results.append(res)
        print(f"{label:40s} {res['ratio']:5.2f}x   ({a} {res['fps'][a]:8.0f} fps, {b} {res['fps'][b]:8.0f} fps; "
              f"per round {', '.join(f'{r:.2f}' for r in res['ratios'])})", flush=True)  # fmt: skip
    print("\n| pair | ratio (median of rounds) | frames/s |\n| --- | --- | --- |")
    for res in results:
        a, b = res["a"], res["b"]
        print(f"| {res['label']} | {res['ratio']:.2f}x | {b} {res['fps'][b]:.0f}, {a} {res['fps'][a]:.0f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"frames_per_batch": args.frames_per_batch, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
