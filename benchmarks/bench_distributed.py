#!/usr/bin/env python
"""Distributed collectors side by side: aiocollect vs TorchRL vs a bare loop, in one run.

Same work for every row: 2 collection nodes started as local processes (``launcher="mp"``),
each running one single-process collector over the workload's env, with bench_collect's
64-64 MLP policy (argmax), gloo. Rows:

* the single-process bare loop of ``bench_collect.py`` (ratio context: what one core does),
* aiocollect ``DistributedCollector(sync=True)``, ``DistributedCollector(sync=False)`` and
  ``DistributedSyncCollector``,
* TorchRL's ``DistributedDataCollector(sync=True / False)`` and ``DistributedSyncDataCollector``
  (skipped with a note without torchrl; a row that fails or hangs is reported, not fatal).

Workloads: CartPole-v1 (a SyncVectorEnv of 8 per node) and bench_multi's HeavyEnv (about 1 ms
of CPU per step, 1 per node). Each row runs in a fresh interpreter (so start-up is cold, as a
user sees it) and reports: time from construction to the first batch, frames/s over the
batches after the first, time from leaving the loop to every node gone, and the trainer
process's CPU use while it waits. ``python -c "import torch, gymnasium"`` is timed in the same
run as the floor for the first batch.

Usage::

    python benchmarks/bench_distributed.py            # full run (about 4 min on 2 idle cores)
    python benchmarks/bench_distributed.py --quick    # smoke (about 1.5 min)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

NODES = 2
ROWS = [
    ("bare loop (1 process)", "bare", {}),
    ("aiocollect DistributedCollector sync=True", "aio", {"cls": "DistributedCollector", "sync": True}),
    ("aiocollect DistributedCollector sync=False", "aio", {"cls": "DistributedCollector", "sync": False}),
    ("aiocollect DistributedSyncCollector", "aio", {"cls": "DistributedSyncCollector"}),
    ("TorchRL DistributedDataCollector sync=True", "trl", {"cls": "DistributedDataCollector", "sync": True}),
    ("TorchRL DistributedDataCollector sync=False", "trl", {"cls": "DistributedDataCollector", "sync": False}),
    ("TorchRL DistributedSyncDataCollector", "trl", {"cls": "DistributedSyncDataCollector"}),
]
PAIRS = {  # aiocollect row -> its TorchRL counterpart
    "aiocollect DistributedCollector sync=True": "TorchRL DistributedDataCollector sync=True",
    "aiocollect DistributedCollector sync=False": "TorchRL DistributedDataCollector sync=False",
    "aiocollect DistributedSyncCollector": "TorchRL DistributedSyncDataCollector",
}
WORKLOADS = {"cartpole8": 800, "heavy": 100}  # frames per node per batch
WARMUP = 4  # batches after the first that are not timed
HELPERS = ("resource_tracker", "forkserver", "semaphore_tracker")  # process-wide, not nodes


def _free_ports(n: int) -> int:
    """A port p with p .. p+n-1 all free now (TorchRL uses tcp_port and the next ones)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n >= 65536:
            continue
        ok = True
        for p in range(base, base + n):
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
                    break
        if ok:
            return base
    raise RuntimeError("no run of free ports found")


# ------------------------------------------------------------------------------------------
# One row, in a child interpreter
# ------------------------------------------------------------------------------------------


def _env_fns(workload: str, trl: bool) -> Any:
    import bench_multi as bm

    if workload == "cartpole8":
        return bm.trl_cartpole8 if trl else bm.make_cartpole8
    return functools.partial(bm.trl_heavy, bm.HEAVY_WORK) if trl else functools.partial(bm.make_heavy, bm.HEAVY_WORK)


def _policy() -> Any:
    import bench_collect as bc
    import torch

    torch.manual_seed(0)
    return bc.DiscretePolicy(4, 2)


def _measure(batches: Any, t0: float, n: int, close: Any) -> dict[str, Any]:
    import psutil

    me = psutil.Process()
    it = iter(batches)
    first = next(it)
    t_first_batch = time.perf_counter()
    for _ in range(WARMUP):  # batches collected ahead while the trainer started are not steady state
        next(it)
    t_first = time.perf_counter()
    frames = 0
    cpu0 = sum(me.cpu_times()[:2])
    for i, b in enumerate(it, 1):
        frames += b.numel()
        if i >= n:
            break
    t_last = time.perf_counter()
    cpu = (sum(me.cpu_times()[:2]) - cpu0) / (t_last - t_first)
    t_close = time.perf_counter()
    close()
    kids = psutil.Process().children(recursive=True)
    nodes = []
    for k in kids:
        try:
            if not any(h in " ".join(k.cmdline()) for h in HELPERS):
                nodes.append(k)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(nodes, timeout=30)
    closed = time.perf_counter() - t_close
    return {
        "first_s": t_first_batch - t0,
        "fps": frames / (t_last - t_first),
        "close_s": closed,
        "cpu": cpu,
        "shape": list(first.shape),
        "left": len(alive),
    }


def run_row(kind: str, workload: str, opts: dict[str, Any], n: int, port: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    fpb = WORKLOADS[workload]
    if kind == "bare":
        import bench_collect as bc
        import torch

        torch.set_num_threads(1)  # bench_collect's setting for the bare loop: fastest for a tiny MLP

        env_fn = _env_fns(workload, False)
        gen = bc.bare_loop(env_fn, _policy(), fpb, fpb * (n + WARMUP + 2) * NODES, same_step=True)

        class _B:  # bare batches are dicts: count their frames like TensorDicts
            def __init__(self, d: dict[str, Any]) -> None:
                self.shape = tuple(d["reward"].shape)

            def numel(self) -> int:
                return int(torch.Size(self.shape).numel())

        return _measure((_B(b) for b in gen), t0, n, gen.close)
    if kind == "aio":
        from aiocollect import blocking

        cls = getattr(blocking, opts["cls"])
        extra = {"sync": opts["sync"]} if "sync" in opts else {}
        c = cls(
            [_env_fns(workload, False)] * NODES, _policy(), frames_per_batch=fpb * NODES, total_frames=-1,
            launcher="mp", **extra,
        )  # fmt: skip
        c.__enter__()
        return _measure(c, t0, n, lambda: c.__exit__(None, None, None))
    import torchrl.collectors.distributed as trd
    from tensordict.nn import TensorDictModule
    import torchrl.collectors as trc

    single = getattr(trc, "SyncDataCollector", None) or trc.Collector  # renamed in torchrl 0.14

    cls = getattr(trd, opts["cls"], None) or getattr(trd, opts["cls"].replace("DataCollector", "Collector"))
    extra = {"sync": opts["sync"]} if "sync" in opts else {}
    policy = TensorDictModule(_policy(), in_keys=["observation"], out_keys=["action"])
    c = cls(
        [_env_fns(workload, True)] * NODES, policy, frames_per_batch=fpb * NODES, total_frames=fpb * NODES * (n + WARMUP + 4),
        collector_class=single, launcher="mp", tcp_port=str(port), **extra,
    )  # fmt: skip
    return _measure(c, t0, n, c.shutdown)


# ------------------------------------------------------------------------------------------
# The parent: one child per row, a table and the ratios
# ------------------------------------------------------------------------------------------


def _child(kind: str, workload: str, opts: dict[str, Any], n: int, timeout: float) -> dict[str, Any]:
    arg = json.dumps({"kind": kind, "workload": workload, "opts": opts, "n": n, "port": _free_ports(8)})
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": os.environ.get("GLOO_SOCKET_IFNAME", "lo")}
    try:
        out = subprocess.run(
            [sys.executable, __file__, "--row", arg], capture_output=True, text=True, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)  # type: ignore[no-any-return]
    tail = (out.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"exit {out.returncode}: {tail[:160]}"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches, CartPole only")
    parser.add_argument("--row", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        spec = json.loads(args.row)
        print(json.dumps(run_row(spec["kind"], spec["workload"], spec["opts"], spec["n"], spec["port"])))
        return
    import importlib.util

    has_trl = importlib.util.find_spec("torchrl") is not None
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch, gymnasium"], check=True)
    floor = time.perf_counter() - t
    print(f'python -c "import torch, gymnasium": {floor:.2f}s (the first-batch floor)\n')
    n = 10 if args.quick else 40
    workloads = ["cartpole8"] if args.quick else list(WORKLOADS)
    results: dict[tuple[str, str], dict[str, Any]] = {}
    for workload in workloads:
        print(f"== {workload}: {NODES} nodes, {WORKLOADS[workload]} frames per node per batch, {n} batches")
        head = f"{'row':46s} {'frames/s':>9s} {'vs bare':>8s} {'vs TorchRL':>10s} {'1st batch':>10s} {'shutdown':>9s} {'CPU':>6s}"
        print(head)
        for label, kind, opts in ROWS:
            if kind == "trl" and not has_trl:
                results[workload, label] = {"error": "torchrl is not installed"}
            else:
                results[workload, label] = _child(kind, workload, opts, n, timeout=240)
            r = results[workload, label]
            if "error" in r:
                print(f"{label:46s} {r['error']}")
                continue
            bare = results.get((workload, ROWS[0][0]), {}).get("fps")
            twin = results.get((workload, PAIRS.get(label, "")), {}).get("fps")
            vs_bare = f"{r['fps'] / bare:.2f}x" if bare else "-"
            vs_trl = f"{r['fps'] / twin:.2f}x" if twin else "-"
            print(
                f"{label:46s} {r['fps']:9.0f} {vs_bare:>8s} {vs_trl:>10s} {r['first_s']:9.2f}s "
                f"{r['close_s']:8.2f}s {100 * r['cpu']:5.0f}%"
            )
        # TorchRL rows run after aiocollect's: print the aiocollect/TorchRL ratios again.
        for a, b in PAIRS.items():
            ra, rb = results.get((workload, a), {}), results.get((workload, b), {})
            if "fps" in ra and "fps" in rb:
                print(
                    f"  {a.removeprefix('aiocollect ')}: {ra['fps'] / rb['fps']:.2f}x TorchRL's frames/s, "
                    f"first batch {ra['first_s'] / floor:.2f}x the import floor (TorchRL {rb['first_s'] / floor:.2f}x)"
                )
        print()
    med = statistics.median(r["first_s"] for (w, lab), r in results.items() if "first_s" in r and "aiocollect" in lab)
    print(f"median aiocollect first batch {med:.2f}s = {med / floor:.2f}x the import floor")


if __name__ == "__main__":
    main()
