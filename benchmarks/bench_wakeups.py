#!/usr/bin/env python
"""Wake-ups per node event: what N nodes starting (or stopping) cost the trainer's event loop.

While the distributed, RPC and Ray transports start their nodes, and while the RPC and Ray
ones stop them, one task per node waits on the transport's `Notifier` for its own node's
event (joined, ready, gone), and the nodes' reader threads (or engine callbacks) notify it.
This script runs that pattern alone, without processes: N tasks on one event loop each wait
for their node's flag, and a thread (the readers' side) sets the flags one node after another,
each once the previous node's task has seen its own, as nodes that get ready at different
moments do. Two rows per node count, taking turns:

* **per node**: each task waits on its node's key and the thread calls ``notify(w)``, as the
  transports do since 2026-11-28: one wake-up per event;
* **every waiter (before)**: each task waits on any change (no key), as every wait did
  before: each event wakes every task still waiting, N²/2 wake-ups in all.

Per row: the wake-ups (predicate checks after the first), the process's CPU time and the wall
time from the first flag to the last task done, and the CPU per node.

Usage::

    python benchmarks/bench_wakeups.py                    # 16, 64, 256, 512 nodes, 5 repeats
    python benchmarks/bench_wakeups.py --quick            # 16 and 64 nodes, 2 repeats
    python benchmarks/bench_wakeups.py --nodes 512 --repeats 3
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
import anyio
from _harness import Col, log

from aiocollect._core._notify import Notifier

ROWS = {"per node": True, "every waiter (before)": False}


async def _one(n: int, keyed: bool) -> dict[str, float]:
    notifier = Notifier()
    ready = [False] * n
    checks = [0]
    seen = threading.Event()

    async def wait(w: int) -> None:
        def flag() -> bool:
            checks[0] += 1
            return ready[w]

        await notifier.wait_until(flag, key=w if keyed else None)
        seen.set()

    def readers() -> None:
        for w in range(n):
            with notifier.lock:
                ready[w] = True
            notifier.notify(w)
            seen.wait()  # the next node gets ready after this one's task has seen it
            seen.clear()

    async with anyio.create_task_group() as tg:
        for w in range(n):
            tg.start_soon(wait, w)
        await anyio.wait_all_tasks_blocked()
        first = checks[0]
        c0, t0 = time.process_time(), time.perf_counter()
        await anyio.to_thread.run_sync(readers)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"wakeups": checks[0] - first, "cpu_ms": cpu * 1e3, "wall_ms": wall * 1e3}


def _measure(sizes: list[int], repeats: int) -> list[dict[str, Any]]:
    runs: dict[tuple[int, str], list[dict[str, float]]] = {}
    cases = [(n, name) for n in sizes for name in ROWS]
    for _, (n, name) in h.round_robin(cases, repeats):
        runs.setdefault((n, name), []).append(anyio.run(_one, n, ROWS[name]))
    records = []
    for (n, name), rs in runs.items():
        med = h.medians(rs, ("wakeups", "cpu_ms", "wall_ms"))
        records.append({"nodes": n, "row": name, **med, "cpu_per_node_us": med["cpu_ms"] * 1e3 / n})
    return records


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(__doc__, quick="16 and 64 nodes, 2 repeats", repeats="runs per row (default 5)", strict=False)
    ap.add_argument("--nodes", type=int, nargs="+", default=None, help="node counts (default 16 64 256 512)")
    args = ap.parse_args(argv)
    sizes = args.nodes or ([16, 64] if args.quick else [16, 64, 256, 512])
    repeats = args.repeats or (2 if args.quick else 5)
    run = h.Session("anyio")
    run.header("bench_wakeups: node events and the tasks waiting for them", f"repeats={repeats}")
    records = _measure(sizes, repeats)
    cols = [
        Col("nodes", "{nodes}"),
        Col("row", "{row}", left=True),
        Col("wake-ups", lambda r: h.fmt_n(r["wakeups"])),
        Col("CPU (ms)", lambda r: f"{r['cpu_ms']:.1f}"),
        Col("wall (ms)", lambda r: f"{r['wall_ms']:.1f}"),
        Col("CPU per node (us)", lambda r: h.fmt_n(r["cpu_per_node_us"])),
    ]
    log(f"\nmedians of {repeats} runs per row; the rows take turns\n")
    for line in h.markdown_table(cols, records):
        log(line)
    run.footer()
    if args.json:
        run.write_json(args.json, rows=records, repeats=repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
