#!/usr/bin/env python
"""InferenceServer: requests per second from many callers, batch sizes, and the event loop's latency.

Each row serves the benchmarks' 64-64 MLP on CartPole-sized observations (4 floats) to
``clients`` callers, each asking again as soon as it has its answer, for ``--seconds``:

* **aiocollect InferenceServer (dict)**: asyncio tasks, ``await server({"observation": obs})``,
  a plain ``nn.Module`` policy; a 1 ms heartbeat task runs on the same loop;
* **aiocollect InferenceServer (TensorDict)**: the same with ``TensorDict`` requests and a
  ``TensorDictModule`` policy (TorchRL's request type);
* **TorchRL InferenceServer (threads)**: TorchRL's server (``transport="auto"``: in-process
  threads), one thread per caller, each calling ``client(td)`` (optional dependency);
* **bare asyncio batcher**: the tightest honest reference: the same asyncio callers on plain
  futures, and a loop that stacks what is pending (up to ``max_batch_size``), runs the forward
  pass on the event loop itself (no thread, so it blocks the loop) and sets the results.

Reported: requests/s, its ratio to the bare batcher and to TorchRL's server, the mean batch
size the server ran, and the heartbeat p99 / max (target: p99 < 20 ms while serving).

Usage::

    python benchmarks/bench_inference_server.py                 # 64 and 256 callers, 3 s per row
    python benchmarks/bench_inference_server.py --quick         # 64 callers, 1 s per row
    python benchmarks/bench_inference_server.py --no-torchrl
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
import _workloads as wl
import torch
from _harness import Col, log

MAX_BATCH = 64
HEARTBEAT_P99_MS = 20.0


def _policy() -> torch.nn.Module:
    return wl.seeded(wl.DiscretePolicy, 4, 2)


def _td_policy() -> Any:
    from tensordict.nn import TensorDictModule

    return TensorDictModule(_policy(), in_keys=["observation"], out_keys=["action"])


async def _serve_aiocollect(clients: int, seconds: float, tensordict: bool) -> dict[str, Any]:
    import anyio
    from tensordict import TensorDict

    from aiocollect import InferenceServer

    hb = h.Heartbeat()
    served = [0]
    policy = _td_policy() if tensordict else _policy()

    def request() -> Any:
        obs = torch.randn(4)
        return TensorDict(observation=obs) if tensordict else {"observation": obs}

    async with anyio.create_task_group() as outer:
        outer.start_soon(hb.run)
        async with InferenceServer(policy, max_batch_size=MAX_BATCH) as server:
            end = time.perf_counter() + seconds

            async def client() -> None:
                req = request()
                while time.perf_counter() < end:
                    await server(req)
                    served[0] += 1

            t0 = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(clients):
                    tg.start_soon(client)
            elapsed = time.perf_counter() - t0
            stats = server.stats()
        hb.stop()
    gaps = h.gap_summary(hb.gaps(since=t0))
    return {"rps": served[0] / elapsed, "batch": stats["mean_batch_size"], "hb_p99": gaps["p99_ms"],
            "hb_max": gaps["max_ms"]}  # fmt: skip


def _serve_torchrl(clients: int, seconds: float) -> dict[str, Any]:
    from tensordict import TensorDict
    from torchrl.modules.inference_server import InferenceServer

    served = [0] * clients
    with InferenceServer(_td_policy(), transport="auto", max_batch_size=MAX_BATCH) as server:
        end = time.perf_counter() + seconds

        def client(i: int) -> None:
            call, td = server.client(), TensorDict(observation=torch.randn(4))
            while time.perf_counter() < end:
                call(td)
                served[i] += 1

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        stats = server.stats()
    # Its stats() names the mean batch size avg_batch_size (or a similar key, by version).
    batch = next((v for k, v in stats.items() if "batch" in k and "size" in k and "avg" in k), h.NAN)
    return {"rps": sum(served) / elapsed, "batch": batch, "hb_p99": h.NAN, "hb_max": h.NAN}


async def _bare(clients: int, seconds: float) -> dict[str, Any]:
    """The tightest honest batcher: asyncio futures, the forward pass on the loop itself, no thread."""
    import asyncio

    policy = _policy()
    pending: list[tuple[torch.Tensor, asyncio.Future[Any]]] = []
    wake = asyncio.Event()
    served, end = [0], time.perf_counter() + seconds
    loop = asyncio.get_running_loop()

    async def client() -> None:
        obs = torch.randn(4)
        while time.perf_counter() < end:
            fut = loop.create_future()
            pending.append((obs, fut))
            wake.set()
            await fut
            served[0] += 1

    async def serve() -> None:
        with torch.no_grad():
            while True:
                await wake.wait()
                wake.clear()
                while pending:
                    batch = pending[:MAX_BATCH]
                    del pending[:MAX_BATCH]
                    rows = policy(torch.stack([o for o, _ in batch])).unbind(0)
                    for (_, fut), row in zip(batch, rows, strict=True):
                        fut.set_result({"action": row})

    server = asyncio.ensure_future(serve())
    t0 = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    elapsed = time.perf_counter() - t0
    server.cancel()
    return {"rps": served[0] / elapsed, "batch": h.NAN, "hb_p99": h.NAN, "hb_max": h.NAN}


COLUMNS = [
    Col("server", "{label}", left=True),
    Col("callers", "{clients}"),
    Col("requests/s", lambda r: h.fmt_n(r["rps"], sep=True)),
    Col("x bare batcher", h.ratio("vs_bare")),
    Col("x TorchRL server", h.ratio("vs_torchrl")),
    Col("mean batch", lambda r: h.fmt_n(r["batch"], 1)),
    Col(
        "heartbeat p99 / max ms",
        lambda r: "-" if r["hb_p99"] != r["hb_p99"] else f"{r['hb_p99']:.1f} / {r['hb_max']:.1f}",
    ),
]


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(__doc__, quick="64 callers, 1 s per row", no_torchrl="leave out TorchRL's InferenceServer")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per row (default 3, --quick 1)")
    ap.add_argument("--clients", type=int, nargs="+", help="caller counts (default 64 256)")
    args = ap.parse_args(argv)
    import asyncio

    import anyio

    import aiocollect

    torch.set_num_threads(1)
    seconds = args.seconds or (1.0 if args.quick else 3.0)
    counts = args.clients or ([64] if args.quick else [64, 256])
    note = h.torchrl_note(args.no_torchrl, import_it=True)
    run = h.Session("torch", "tensordict", "anyio", aiocollect=aiocollect.__version__)
    run.header(f"bench_inference_server: {seconds:g} s per row, max_batch_size={MAX_BATCH}, 64-64 MLP", "",
               *([note] if note else []))  # fmt: skip
    rows: list[dict[str, Any]] = []
    for clients in counts:
        bare = {
            "label": "bare asyncio batcher",
            "clients": clients,
            "kind": "bare",
            **asyncio.run(_bare(clients, seconds)),
        }
        log(f"  bare asyncio batcher x{clients}: {bare['rps']:.0f} requests/s")
        for label, td in (
            ("aiocollect InferenceServer (dict)", False),
            ("aiocollect InferenceServer (TensorDict)", True),
        ):
            r = anyio.run(_serve_aiocollect, clients, seconds, td)
            rows.append({"label": label, "clients": clients, "kind": "aio", **r})
            log(f"  {label} x{clients}: {r['rps']:.0f} requests/s")
        if note is None:
            r = _serve_torchrl(clients, seconds)
            rows.append({"label": "TorchRL InferenceServer (threads)", "clients": clients, "kind": "torchrl", **r})
            log(f"  TorchRL InferenceServer x{clients}: {r['rps']:.0f} requests/s")
        rows.append(bare)
    for r in rows:
        trl = h.find(rows, kind="torchrl", clients=r["clients"])
        ref = h.find(rows, kind="bare", clients=r["clients"])
        r["vs_bare"] = h.div(r["rps"], ref["rps"])
        r["vs_torchrl"] = h.div(r["rps"], trl["rps"]) if trl and r.get("kind") == "aio" else h.NAN
    log("")
    for line in h.markdown_table(COLUMNS, rows):
        log(line)
    checks = h.Checks()
    for r in rows:
        if r.get("kind") == "aio":
            checks.add(f"{r['label']} x{r['clients']}: heartbeat p99 < {HEARTBEAT_P99_MS:g} ms",
                       r["hb_p99"] < HEARTBEAT_P99_MS, f"{r['hb_p99']:.1f} ms")  # fmt: skip
    checks.report()
    run.footer()
    run.write_json(args.json, rows=rows)
    return checks.exit_code(args.strict)


if __name__ == "__main__":
    sys.exit(main())
