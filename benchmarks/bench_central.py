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
  request 20 ms after it arrives. The server's nominal capacity is 256 requests per 20 ms,
  12,800 frames/s; what a client can get from it here is measured too: 256 asyncio tasks that
  only send requests (the same client, no envs, no collector). Rows report their share of
  both. The collector also runs with ``gc_freeze=False`` (see ``docs/central-inference.md``).

Each row runs in a fresh interpreter (the harness's fresh-process runner), collects a warm-up
batch, then times ``--batches`` batches; frames/s is the median of ``--repeats`` runs. Ratios are to
the rows the issue names: TorchRL's ``AsyncBatchedCollector`` and aiocollect's in-process
collector (``cartpole64``), ``MultiSyncCollector`` (``heavy``).

Usage::

    python benchmarks/bench_central.py                      # every workload, 3 repeats
    python benchmarks/bench_central.py --quick              # cartpole64 without TorchRL, one repeat
    python benchmarks/bench_central.py --workload coroutine --repeats 1
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
import _workloads as wl
import torch
from _harness import Col, log
from torch import nn

N_ENVS = 64
BARE_CLIENT = "bare asyncio client (256 tasks, no envs)"


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
    dev = row.split("policy on ")[1].rstrip(")") if "policy on " in row else None
    make = functools.partial(wl.make_env, "CartPole-v1")
    total = fpb * (batches + 2)
    if row == "bare loop":
        vec = functools.partial(wl.make_vec, "CartPole-v1", N_ENVS)
        return _time_iter(wl.bare_loop(vec, policy, fpb, total), batches, lambda b: b["observation"][..., 0].numel())
    if workload == "coroutine":
        return run_coroutine_row(row, fpb, batches)
    if row.startswith("aiocollect"):
        from aiocollect.blocking import AsyncBatchedCollector, Collector, MultiSyncCollector

        if row == "aiocollect Collector (in-process)":
            vec = functools.partial(wl.make_vec, "CartPole-v1", N_ENVS)
            c: Any = Collector(vec, policy, frames_per_batch=fpb, total_frames=total)
        elif row == "aiocollect MultiSyncCollector (2 workers)":
            vec = functools.partial(wl.make_vec, "CartPole-v1", N_ENVS // 2)
            c = MultiSyncCollector([vec, vec], policy, frames_per_batch=fpb, total_frames=total)
        elif row.startswith("aiocollect MultiSyncCollector (2 workers, policy on"):
            vec = functools.partial(wl.make_vec, "CartPole-v1", N_ENVS // 2)
            c = MultiSyncCollector([vec, vec], policy, frames_per_batch=fpb, total_frames=total, policy_device=dev)
        else:
            backend = "threading" if "thread" in row else "multiprocessing"
            min_batch = 64 if "min_batch" in row else None
            c = AsyncBatchedCollector([make] * N_ENVS, policy=policy, frames_per_batch=fpb, total_frames=total,
                                      env_backend=backend, min_batch_size=min_batch, device=dev)  # fmt: skip
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
        "aiocollect AsyncBatchedCollector (coroutine policy, 256 envs, gc_freeze=False)",
        BARE_CLIENT,
    ],
}
SERVER_DELAY = 0.020
CORO_ENVS = 256


def gpu_rows(dev: str) -> list[str]:
    """The heavy workload's rows with the policy on ``dev`` (``--heavy-device``; a GPU machine)."""
    return [
        f"aiocollect AsyncBatchedCollector (2 env processes, min_batch_size=64, policy on {dev})",
        f"aiocollect MultiSyncCollector (2 workers, policy on {dev})",
    ]


def serve_model(port_file: str) -> None:
    """The loopback model server (its own process): answers each request 20 ms after it arrives.

    Requests are queued as they arrive; one task answers, in arrival order, every request that
    is due, in one pass per wake-up (a batched model would answer a batch at once). It runs on
    uvloop when that is installed: the server stands for a model with a fixed 20 ms latency, so
    its own loop overhead should add as little as possible to it.
    """
    import asyncio
    from collections import deque

    async def main() -> None:
        loop = asyncio.get_running_loop()
        due: deque[tuple[float, asyncio.StreamWriter, bytes]] = deque()
        wake = asyncio.Event()

        async def answer() -> None:
            while True:
                if not due:
                    wake.clear()
                    await wake.wait()
                    continue
                now = loop.time()
                if due[0][0] > now:
                    await asyncio.sleep(due[0][0] - now)
                    continue
                while due and due[0][0] <= now:
                    _, writer, action = due.popleft()
                    writer.write(action)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            while line := await reader.readline():
                action = b"1\n" if float(line.split()[2]) > 0 else b"0\n"  # push the pole the way it leans
                due.append((loop.time() + SERVER_DELAY, writer, action))
                wake.set()

        answering = asyncio.create_task(answer())
        server = await asyncio.start_server(handle, "127.0.0.1", 0, backlog=1024)
        port = str(server.sockets[0].getsockname()[1])
        await asyncio.to_thread(Path(port_file).write_text, port)
        try:
            await server.serve_forever()
        finally:
            answering.cancel()

    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
    else:
        uvloop.run(main())


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


async def bare_client(port: int, seconds: float) -> float:
    """What the server gives 256 asyncio tasks that only ask it (no envs, no collector): requests/s."""
    import asyncio

    client, count, stop = ModelClient(port), [0], asyncio.Event()
    obs = torch.tensor([0.0, 0.0, 0.01, 0.0])

    async def one(env: int) -> None:
        td = {"observation": obs, ("collector", "env_id"): torch.tensor(env)}
        await asyncio.sleep(env * SERVER_DELAY / CORO_ENVS)  # spread out, as envs that step are
        while not stop.is_set():
            await client(td)
            count[0] += 1

    tasks = [asyncio.create_task(one(i)) for i in range(CORO_ENVS)]
    await asyncio.sleep(1.0)  # connected and in step
    start, first = time.perf_counter(), count[0]
    await asyncio.sleep(seconds)
    rate = (count[0] - first) / (time.perf_counter() - start)
    stop.set()
    await asyncio.gather(*tasks)
    return rate


def run_coroutine_row(row: str, fpb: int, batches: int) -> float:
    import tempfile

    import anyio

    from aiocollect import AsyncBatchedCollector

    port_file = tempfile.mktemp()
    server = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", port_file])
    try:
        while not (os.path.exists(port_file) and open(port_file).read()):
            time.sleep(0.01)
        port = int(open(port_file).read())
        if row == BARE_CLIENT:
            return anyio.run(bare_client, port, fpb * batches / (0.9 * CORO_ENVS / SERVER_DELAY))
        client = ModelClient(port)
        make = functools.partial(wl.make_env, "CartPole-v1")
        gc_freeze = False if "gc_freeze=False" in row else None

        async def main() -> float:
            async with AsyncBatchedCollector([make] * CORO_ENVS, policy=client, frames_per_batch=fpb,
                                             total_frames=fpb * (batches + 1), gc_freeze=gc_freeze) as c:  # fmt: skip
                it = aiter(c)
                await anext(it)
                start, frames = time.perf_counter(), 0
                async for b in it:
                    frames += b.numel()
                return frames / (time.perf_counter() - start)

        return anyio.run(main)
    finally:
        server.kill()
        server.wait()
        if os.path.exists(port_file):
            os.unlink(port_file)


TARGETS = {  # (row, reference row, least ratio): the targets
    "cartpole64": [
        ("aiocollect AsyncBatchedCollector (1 env thread)", "TorchRL AsyncBatchedCollector (threading)", 5.0),
        ("aiocollect AsyncBatchedCollector (1 env thread)", "aiocollect Collector (in-process)", 0.8),
    ],
    "heavy": [
        (
            "aiocollect AsyncBatchedCollector (2 env processes, min_batch_size=64, 2 torch threads)",
            "aiocollect MultiSyncCollector (2 workers)",
            1.5,
        ),
    ],
    "coroutine": [
        ("aiocollect AsyncBatchedCollector (coroutine policy, 256 envs)", "capacity", 0.9),
        ("aiocollect AsyncBatchedCollector (coroutine policy, 256 envs)", BARE_CLIENT, 0.9),
    ],
}
REFS = {
    "cartpole64": ["TorchRL AsyncBatchedCollector (threading)", "aiocollect Collector (in-process)", "bare loop"],
    "heavy": ["aiocollect MultiSyncCollector (2 workers)"],
    "coroutine": ["capacity", BARE_CLIENT],
}


def child_main(cfg: dict[str, Any], t_start: float) -> dict[str, Any]:
    return {"fps": run_row(cfg["row"], cfg["workload"], cfg["fpb"], cfg["batches"])}


def _child_entry(cfg_json: str, t_start: float) -> None:
    h.child_entry(child_main, cfg_json, t_start)


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(__doc__, quick="cartpole64 without TorchRL, one repeat, 2 timed batches",
                  repeats="fresh-process runs per row (median; default 3)",
                  no_torchrl="leave out TorchRL's rows")  # fmt: skip
    ap.add_argument("--workload", action="append", choices=sorted(ROWS), help="default: all")
    ap.add_argument("--frames-per-batch", type=int, default=3200)
    ap.add_argument("--batches", type=int, default=None, help="timed batches per run, after one warm-up (default 5)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    ap.add_argument("--heavy-device", help="also run the heavy rows with the policy on this device (e.g. cuda)")
    ap.add_argument("--only", action="append", metavar="TEXT", help="only the rows whose name holds TEXT (repeatable)")
    ap.add_argument("--serve", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.serve:
        serve_model(args.serve)
        return 0
    workloads = args.workload or (["cartpole64"] if args.quick else sorted(ROWS))
    repeats = args.repeats or (1 if args.quick else 3)
    batches = args.batches or (2 if args.quick else 5)
    no_torchrl = args.no_torchrl or args.quick
    import aiocollect

    run = h.Session("torch", "tensordict", "gymnasium", "torchrl", aiocollect=aiocollect.__version__)
    run.header(
        f"bench_central: {repeats} fresh process(es) per row, rows round robin; one warm-up batch, then {batches} "
        f"timed batches of {args.frames_per_batch} frames",
        sys.executable,
    )
    if args.heavy_device:
        ROWS["heavy"] += gpu_rows(args.heavy_device)
        TARGETS["heavy"] += [(gpu_rows(args.heavy_device)[0], "aiocollect MultiSyncCollector (2 workers)", 1.5)]
        REFS["heavy"].append(gpu_rows(args.heavy_device)[1])
    plan = [(w, r) for w in workloads for r in ROWS[w] if not (no_torchrl and r.startswith("TorchRL"))]
    plan = [(w, r) for w, r in plan if not args.only or any(text in r for text in args.only)]

    def config(key: tuple[str, str], _rep: int) -> dict[str, Any]:
        return {"workload": key[0], "row": key[1], "fpb": args.frames_per_batch, "batches": batches}

    def logged(key: tuple[str, str], rep: int, _cfg: dict[str, Any], r: dict[str, Any]) -> None:
        what = f"FAILED {r['error']}" if "error" in r else f"{r['fps']:,.0f} frames/s"
        log(f"  round {rep + 1} {key[0]} / {key[1]}: {what}")

    runs = h.fresh_rounds("bench_central", plan, repeats, config, args.timeout, on_result=logged)
    checks, tables, records = h.Checks(), [], []
    checks.add_runs(runs)
    for w in workloads:
        fps = {r: h.median(x["fps"] for x in runs[(w, r)] if "error" not in x) for ww, r in plan if ww == w}
        if w == "coroutine":
            fps["capacity"] = CORO_ENVS / SERVER_DELAY
        refs = [r for r in REFS[w] if r in fps]
        rows = [
            {"row": r, "fps": v, **{f"x{i}": h.div(v, fps[ref]) for i, ref in enumerate(refs)}} for r, v in fps.items()
        ]
        cols = [Col(f"{w}: row", "{row}", left=True), Col("frames/s", lambda r: h.fmt_n(r["fps"], sep=True))]
        cols += [Col(f"x {ref}", h.ratio(f"x{i}")) for i, ref in enumerate(refs)]
        log("")
        for line in h.console_table(cols, rows):
            log(line)
        tables += [*h.markdown_table(cols, rows), ""]
        records += [{"workload": w, **r} for r in rows]
        for row, ref, least in TARGETS[w]:
            x = h.div(fps.get(row, h.NAN), fps.get(ref, h.NAN))
            checks.add(f"{w}: {row} at least {least}x {ref}", None if not math.isfinite(x) else x >= least, h.fmt_x(x))
    checks.report()
    run.markdown(tables[:-1], f", torch.set_num_threads(1) unless said, frames_per_batch={args.frames_per_batch}")
    run.footer()
    run.write_json(args.json, rows=records, checks=checks.as_json())
    return checks.exit_code(args.strict)


if __name__ == "__main__":  # the guard matters: env worker processes re-import this module
    sys.exit(main())
