#!/usr/bin/env python
"""Central inference: AsyncBatchedCollector side by side with TorchRL's and with per-worker policies.

Workloads (the benchmarks' 64-64 MLP unless said):

* ``cartpole64``: 64 CartPole envs. Rows: the bare loop (`_workloads.bare_loop` on a 64-env
  ``SyncVectorEnv``, the tightest honest loop), aiocollect's in-process `Collector` on the same
  vector env, aiocollect's `AsyncBatchedCollector` with its envs on one thread and in two
  env-only processes, and TorchRL's ``AsyncBatchedCollector`` with ``env_backend="threading"``
  and ``"multiprocessing"`` (optional dependency).
* ``heavy``: a policy whose forward pass at batch 1 costs about 1 ms (a 4-2048-2048-2 MLP),
  2 env workers x 32 CartPoles. Rows: `AsyncBatchedCollector` (two env-only processes, the
  policy once, in this process; also with ``min_batch_size=64``, one forward pass for both
  workers, and with that forward pass on both cores) and `MultiSyncCollector` (two workers,
  each with its own copy, one core each).
* ``coroutine``: 256 CartPoles (one env thread) whose policy is a coroutine function, a client
  of a loopback model server (another process, one TCP connection per env) that answers each
  request 20 ms after it arrives. The server's capacity is 256 requests per 20 ms, 12,800
  frames/s: the row reports its share of it.

Each row runs in a fresh interpreter (``--row`` re-runs this script), collects a warm-up batch,
then times ``--batches`` batches; frames/s is the median of ``--repeats`` runs. Ratios are to
the rows the issue names: TorchRL's ``AsyncBatchedCollector`` and aiocollect's in-process
collector (``cartpole64``), ``MultiSyncCollector`` (``heavy``).

Usage::

    python benchmarks/bench_central.py                      # both workloads, 3 repeats
    python benchmarks/bench_central.py --workload cartpole64 --repeats 1 --no-torchrl
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _workloads as wl
import torch
from torch import nn

N_ENVS = 64


class HeavyPolicy(nn.Module):
    """obs -> action index, about 1 ms per forward pass at batch 1 on one core."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 2048), nn.Tanh(), nn.Linear(2048, 2048), nn.Tanh(), nn.Linear(2048, 2))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return self.net(observation).argmax(-1)


def _policy(workload: str) -> nn.Module:
    return wl.seeded(HeavyPolicy) if workload == "heavy" else wl.seeded(wl.DiscretePolicy)


def _time_iter(it: Any, batches: int, frames_of: Any) -> float:
    """Frames/s over ``batches`` batches after one warm-up batch."""
    next(it)
    start, frames = time.perf_counter(), 0
    for _ in range(batches):
        frames += frames_of(next(it))
    return frames / (time.perf_counter() - start)


def _numel(batch: Any) -> int:
    return int(batch.numel())


def run_row(row: str, workload: str, fpb: int, batches: int) -> float:
    """One row's frames/s (in this process)."""
    # One thread per process, as each MultiSync worker has; the central policy may take both
    # cores instead (its env workers idle while it runs), which the "2 torch threads" row does.
    torch.set_num_threads(2 if "2 torch threads" in row else 1)
    policy = _policy(workload)
    make = functools.partial(wl.make_env, "CartPole-v1")
    total = fpb * (batches + 2)
    if row == "bare loop":
        vec = functools.partial(wl.make_vec, "CartPole-v1", N_ENVS)
        return _time_iter(wl.bare_loop(vec, policy, fpb, total), batches, lambda b: b["observation"][..., 0].numel())
    if workload == "coroutine":
        return run_coroutine_row(fpb, batches)
    if row.startswith("aiocollect"):
        from aiocollect.blocking import AsyncBatchedCollector, Collector, MultiSyncCollector

        if row == "aiocollect Collector (in-process)":
            vec = functools.partial(wl.make_vec, "CartPole-v1", N_ENVS)
            c: Any = Collector(vec, policy, frames_per_batch=fpb, total_frames=total)
        elif row == "aiocollect MultiSyncCollector (2 workers)":
            vec = functools.partial(wl.make_vec, "CartPole-v1", N_ENVS // 2)
            c = MultiSyncCollector([vec, vec], policy, frames_per_batch=fpb, total_frames=total)
        else:
            backend = "threading" if "thread" in row else "multiprocessing"
            min_batch = 64 if "min_batch" in row else None
            c = AsyncBatchedCollector([make] * N_ENVS, policy=policy, frames_per_batch=fpb, total_frames=total,
                                      env_backend=backend, min_batch_size=min_batch)  # fmt: skip
        with c:
            return _time_iter(iter(c), batches, _numel)
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import AsyncBatchedCollector as TorchRLAsyncBatched
    from torchrl.envs import GymEnv

    td_policy = TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
    backend = "threading" if "thread" in row else "multiprocessing"
    trl_make = functools.partial(GymEnv, "CartPole-v1", categorical_action_encoding=True)
    c = TorchRLAsyncBatched([trl_make] * N_ENVS, policy=td_policy, frames_per_batch=fpb, total_frames=total,
                            env_backend=backend)  # fmt: skip
    try:
        return _time_iter(iter(c), batches, _numel)
    finally:
        c.shutdown()


ROWS = {
    "cartpole64": [
        "bare loop",
        "aiocollect Collector (in-process)",
        "aiocollect AsyncBatchedCollector (1 env thread)",
        "aiocollect AsyncBatchedCollector (2 env processes)",
        "TorchRL AsyncBatchedCollector (threading)",
        "TorchRL AsyncBatchedCollector (multiprocessing)",
    ],
    "heavy": [
        "aiocollect AsyncBatchedCollector (2 env processes)",
        "aiocollect AsyncBatchedCollector (2 env processes, min_batch_size=64)",
        "aiocollect AsyncBatchedCollector (2 env processes, min_batch_size=64, 2 torch threads)",
        "aiocollect MultiSyncCollector (2 workers)",
    ],
    "coroutine": [
        "aiocollect AsyncBatchedCollector (coroutine policy, 256 envs)",
    ],
}
SERVER_DELAY = 0.020
CORO_ENVS = 256
USE_UVLOOP = False  # set per row


def serve_model(port_file: str) -> None:
    """The loopback model server (its own process): each request line is answered 20 ms after it arrives."""
    import asyncio

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        while line := await reader.readline():
            action = b"1\n" if float(line.split()[2]) > 0 else b"0\n"  # push the pole the way it leans
            loop.call_later(SERVER_DELAY, writer.write, action)

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port = str(server.sockets[0].getsockname()[1])
        await asyncio.to_thread(Path(port_file).write_text, port)
        await server.serve_forever()

    asyncio.run(main())


class ModelClient:
    """The coroutine policy: one connection per env to the model server."""

    def __init__(self, port: int) -> None:
        self.port, self.conns = port, {}

    async def __call__(self, td: Any) -> torch.Tensor:
        import asyncio  # the row runs on asyncio; its streams are the leanest client there is

        env = int(td["collector", "env_id"])
        conn = self.conns.get(env)
        if conn is None:
            conn = self.conns[env] = await asyncio.open_connection("127.0.0.1", self.port)
        obs = td["observation"].tolist()
        conn[1].write((" ".join(f"{x:.4f}" for x in obs) + "\n").encode())
        return torch.tensor(int(await conn[0].readline()))


def run_coroutine_row(fpb: int, batches: int) -> float:
    import tempfile

    import anyio

    from aiocollect import AsyncBatchedCollector

    port_file = tempfile.mktemp()
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", port_file])
    try:
        while not (os.path.exists(port_file) and open(port_file).read()):
            time.sleep(0.01)
        client = ModelClient(int(open(port_file).read()))
        make = functools.partial(wl.make_env, "CartPole-v1")

        async def main() -> float:
            async with AsyncBatchedCollector([make] * CORO_ENVS, policy=client, frames_per_batch=fpb,
                                             total_frames=fpb * (batches + 1)) as c:  # fmt: skip
                it = aiter(c)
                await anext(it)
                start, frames = time.perf_counter(), 0
                async for b in it:
                    frames += b.numel()
                return frames / (time.perf_counter() - start)

        return anyio.run(main, backend_options={"use_uvloop": USE_UVLOOP})
    finally:
        server.kill()
        server.wait()
        if os.path.exists(port_file):
            os.unlink(port_file)


def _in_fresh_process(row: str, workload: str, fpb: int, batches: int, timeout: float) -> float:
    cmd = [sys.executable, os.path.abspath(__file__), "--row", row, "--workload", workload,
           "--frames-per-batch", str(fpb), "--batches", str(batches)]  # fmt: skip
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        print(f"  {row}: timed out after {timeout:.0f}s", file=sys.stderr)
        return float("nan")
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return float(json.loads(line[7:])["fps"])
    print(f"  {row}: failed\n{out.stderr[-2000:]}", file=sys.stderr)
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workload", action="append", choices=sorted(ROWS), help="default: all")
    ap.add_argument("--repeats", type=int, default=3, help="fresh-process runs per row (median)")
    ap.add_argument("--frames-per-batch", type=int, default=3200)
    ap.add_argument("--batches", type=int, default=5, help="timed batches per run, after one warm-up batch")
    ap.add_argument("--no-torchrl", action="store_true", help="leave out TorchRL's rows")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--row", help=argparse.SUPPRESS)
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve_model(args.serve)
        return
    workloads = args.workload or sorted(ROWS)
    if args.row:
        fps = run_row(args.row, workloads[0], args.frames_per_batch, args.batches)
        print("RESULT " + json.dumps({"fps": fps}), flush=True)
        return
    print(f"# bench_central  python {sys.version.split()[0]}  torch {torch.__version__}  cpus {os.cpu_count()}  "
          f"load {os.getloadavg()[0]:.2f}")  # fmt: skip
    for workload in workloads:
        rows = [r for r in ROWS[workload] if not (args.no_torchrl and r.startswith("TorchRL"))]
        runs: dict[str, list[float]] = {r: [] for r in rows}
        for _ in range(args.repeats):  # rows round robin: drift hits every row alike
            for r in rows:
                runs[r].append(_in_fresh_process(r, workload, args.frames_per_batch, args.batches, args.timeout))
        fps = {r: statistics.median(v) for r, v in runs.items()}
        refs = {"cartpole64": ["TorchRL AsyncBatchedCollector (threading)", "aiocollect Collector (in-process)",
                               "bare loop"],
                "heavy": ["aiocollect MultiSyncCollector (2 workers)"],
                "coroutine": ["capacity"]}[workload]  # fmt: skip
        if workload == "coroutine":
            fps["capacity"] = CORO_ENVS / SERVER_DELAY
            rows.append("capacity")
        refs = [r for r in refs if r in fps]
        n = CORO_ENVS if workload == "coroutine" else N_ENVS
        print(f"\n## {workload}: {n} CartPoles, frames_per_batch {args.frames_per_batch}, "
              f"median of {args.repeats}")  # fmt: skip
        header = f"{'row':<84} {'frames/s':>10}" + "".join(f"  vs {r.split(' (')[0][:24]:>24}" for r in refs)
        print(header)
        for r in rows:
            cells = "".join(f"  {fps[r] / fps[ref]:>27.2f}x" for ref in refs)
            print(f"{r:<84} {fps[r]:>10,.0f}{cells}")


if __name__ == "__main__":
    main()
