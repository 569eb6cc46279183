#!/usr/bin/env python
"""How the multi-worker engine scales with its node count: close time, trainer CPU, loop latency.

For each node count, in a fresh process (``python -c``, its own process group, killed on
timeout), an async ``DistributedCollector(sync=True)`` (``launcher="mp"``, ``backend="gloo"``,
one CartPole-v1 env and the benchmarks' 64-64 MLP per node, 200 frames per node and batch)
collects a few warm-up batches, then a timed window, then the loop body ``break``s. A 1 ms
heartbeat task runs on the same event loop the whole time. Per row it reports:

* **close ms**: from ``break`` to ``async with`` returning (every node stopped and reaped,
  everything freed) and **gone ms**: to every node process having exited;
* **trainer CPU ms in close**: the trainer process's CPU time (all its threads) over the close:
  what it does once per node runs one node after another, whatever the number of cores;
  **of which loop thread**: the event loop's thread alone, the heartbeat's wake-ups included
  (the rest is the nodes' reader threads and gloo's, which end with the nodes);
* **first batch s**: from the constructor to the first batch (the nodes' start);
* **node MB (own)**: the median node process's memory that it shares with no other process
  (USS; a node forked from a fork server shares what the server imported), and **with its
  processes**: the same summed over the node and every process it started (its fork server
  and workers in the multi rows);
* **CPU ms / node-batch**: the trainer process's CPU time over the timed window per node batch
  it received (what each node costs the trainer);
* **heartbeat p99 / max**: how late the trainer's event loop ran a 1 ms sleeper while
  collecting, and (separately) while closing.

The "MultiSyncCollector x2 per node" rows run each node's collector with two worker processes
and the policy as a `TensorDictModule`. The node forks its workers from a fork server of its
own, which it forks from itself at its start after importing what it runs (as shipped), or,
in the "exec'd" rows, which multiprocessing starts as a new interpreter that imports torch and
the worker loop again (as before; the child process patches the distributed config back to
that). Their "first batch s" and "with its processes" say what the nodes' servers cost.

The last rows run the same engine with ``MultiSyncCollector(backend="inline")`` (each worker a
thread of the trainer process), up to 64 workers: the engine's own per-node cost without
processes. The summary prints each close time over the 2-node one (target: 16 nodes within
1.5x of 2).

Usage::

    python benchmarks/bench_node_scaling.py            # 2, 4, 8, 16 nodes; inline 2, 16, 64
    python benchmarks/bench_node_scaling.py --quick    # 2 and 8 nodes; inline 2 and 16
    python benchmarks/bench_node_scaling.py --nodes 2 16 --repeats 5
    python benchmarks/bench_node_scaling.py --nodes 2 --inline --multi 1 2 4 8    # nodes' fork servers
"""

from __future__ import annotations

import functools
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
import _workloads as wl
from _harness import Col, log

NODE_FPB = 200
MULTI_WORKERS = 2  # worker processes per node in the multi rows
LABELS = {
    "distributed": "DistributedCollector (mp)",
    "multi": f"DistributedCollector (mp), MultiSyncCollector x{MULTI_WORKERS} per node",
    "multi-exec": f"DistributedCollector (mp), MultiSyncCollector x{MULTI_WORKERS} per node, node fork server exec'd",
    "inline": "MultiSyncCollector (inline)",
}
TARGET_16_OVER_2 = 1.5
MEDIAN_KEYS = ("cpu_ms_per_node_batch", "steady_fps", "first_s", "close_cpu_ms", "close_loop_cpu_ms")


def _make(cfg: dict[str, Any], policy: Any) -> Any:
    import aiocollect

    n, fpb = cfg["nodes"], cfg["nodes"] * NODE_FPB
    envs = [functools.partial(wl.make_env, "CartPole-v1")] * n
    if cfg["kind"] == "inline":
        return aiocollect.MultiSyncCollector(envs, policy, frames_per_batch=fpb, total_frames=-1, backend="inline")
    if cfg["kind"] == "multi-exec":
        # The path before nodes forked their own fork server: each node's server a new
        # interpreter that imports torch and the worker loop again.
        from aiocollect._dist import _config

        _config._forks_workers = lambda *_: False
    multi = cfg["kind"] != "distributed"
    if multi:  # as TorchRL users write it; its workers then need tensordict too
        from tensordict.nn import TensorDictModule

        policy = TensorDictModule(policy, ["observation"], ["action"])
    return aiocollect.DistributedCollector(
        envs, policy, sync=True, frames_per_batch=fpb, total_frames=-1, launcher="mp", backend="gloo",
        collector_class=aiocollect.MultiSyncCollector if multi else aiocollect.Collector,
        num_workers_per_collector=MULTI_WORKERS if multi else 1,
    )  # fmt: skip


async def _measure(cfg: dict[str, Any]) -> dict[str, Any]:
    import anyio
    import psutil

    policy = wl.seeded(wl.DiscretePolicy, 4, 2)
    me = psutil.Process()
    hb = h.Heartbeat()
    out: dict[str, Any] = {}
    warm, n = cfg["warm"], cfg["batches"]
    async with anyio.create_task_group() as tg:
        tg.start_soon(hb.run)
        t0 = time.perf_counter()
        async with _make(cfg, policy) as c:
            i = 0
            async for _batch in c:
                i += 1
                if i == 1:
                    out["first_s"] = time.perf_counter() - t0
                if i == warm:
                    # The node processes themselves (in the multi rows, their servers and
                    # workers are descendants too).
                    nodes = [psutil.Process(int(pid)) for pid in c._worker_pids()] if cfg["kind"] != "inline" else []
                    out["node_mb"] = _median_uss_mb(nodes)
                    out["tree_mb"] = _median_uss_mb(nodes, with_descendants=True)
                    cpu0, t_steady = me.cpu_times(), time.perf_counter()
                if i == warm + n:
                    cpu1 = me.cpu_times()
                    break
            # ns clocks, not /proc's 10 ms ticks; the close runs on this thread (the event loop)
            t_break, close_cpu0, loop_cpu0 = time.perf_counter(), time.process_time(), time.thread_time()
        t_closed, close_cpu = time.perf_counter(), time.process_time() - close_cpu0
        loop_cpu = time.thread_time() - loop_cpu0
        hb.stop()
    left = [p for p in nodes if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    deadline = t_closed + 30.0
    while left and time.perf_counter() < deadline:
        await anyio.sleep(0.002)
        left = [p for p in left if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    t_gone = time.perf_counter()
    cpu = (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system)
    steady = [g for _, g in hb.phased(t_steady, t_steady, t_break) if _ == 1]
    closing = [g for _, g in hb.phased(t_break, t_break, t_break) if _ == 2]
    out.update(
        close_s=t_closed - t_break,
        gone_s=t_gone - t_break if not left else None,
        left_alive=[p.pid for p in left],
        cpu_ms_per_node_batch=cpu / (n * cfg["nodes"]) * 1e3,
        # The trainer's own share of a close: what it does once per node runs one node after another.
        close_cpu_ms=close_cpu * 1e3,
        close_loop_cpu_ms=loop_cpu * 1e3,  # of which the event loop's thread
        steady_fps=n * cfg["nodes"] * NODE_FPB / (t_break - t_steady),
        hb_steady=h.gap_summary(steady),
        hb_close=h.gap_summary(closing),
    )
    return out


def _median_uss_mb(procs: list[Any], with_descendants: bool = False) -> float | None:
    """The median node's own memory (USS: pages no other process shares), in MB.

    ``with_descendants``: each node's with that of its processes (its fork server, workers).
    """
    import psutil

    sizes = []
    for p in procs:
        try:
            tree = [p, *p.children(recursive=True)] if with_descendants else [p]
            sizes.append(sum(q.memory_full_info().uss for q in tree) / 2**20)
        except psutil.Error:
            pass
    return h.median(sizes) if sizes else None


def child_main(cfg: dict[str, Any], t_start: float) -> dict[str, Any]:
    import warnings

    import anyio
    import torch

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    return anyio.run(_measure, cfg)


def _child_entry(cfg_json: str, t_start: float) -> None:
    h.child_entry(child_main, cfg_json, t_start)


COLUMNS = [
    Col("collector", "{label}", left=True),
    Col("nodes", "{nodes}"),
    Col("close ms", lambda r: h.fmt_n(r["close_s"] * 1e3)),
    Col("x 2 nodes", h.ratio("close_vs_2")),
    Col("gone ms", lambda r: h.fmt_n((r["gone_s"] or h.NAN) * 1e3)),
    Col("trainer CPU ms in close", lambda r: h.fmt_n(r["close_cpu_ms"], 1)),
    Col("of which loop thread", lambda r: h.fmt_n(r["close_loop_cpu_ms"], 1)),
    Col("first batch s", lambda r: h.fmt_n(r["first_s"], 2)),
    Col("node MB (own)", lambda r: h.fmt_n(r["node_mb"] if r["node_mb"] is not None else h.NAN)),
    Col("with its processes", lambda r: h.fmt_n(r["tree_mb"] if r["tree_mb"] is not None else h.NAN)),
    Col("trainer CPU ms / node-batch", lambda r: h.fmt_n(r["cpu_ms_per_node_batch"], 2)),
    Col("frames/s", lambda r: h.fmt_n(r["steady_fps"])),
    Col("heartbeat p99 ms (collecting)", lambda r: h.fmt_n(r["hb_steady_p99"], 1)),
    Col("heartbeat p99 / max ms (closing)", lambda r: f"{r['hb_close_p99']:.1f} / {r['hb_close_max']:.1f}"),
]


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(__doc__, quick="2 and 8 nodes, inline 2 and 16, one repeat", repeats="fresh processes per row")
    ap.add_argument("--nodes", type=int, nargs="+", help="distributed node counts (default 2 4 8 16)")
    ap.add_argument("--inline", type=int, nargs="*", help="inline worker counts (default 2 16 64)")
    ap.add_argument(
        "--multi",
        type=int,
        nargs="*",
        help=f"node counts for nodes running MultiSyncCollector x{MULTI_WORKERS}, each node's fork server forked "
        "from it (as shipped) and started as a new interpreter (as before), side by side (default 2 4; none "
        "with --quick)",
    )
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    nodes = args.nodes or ([2, 8] if args.quick else [2, 4, 8, 16])
    inline = args.inline if args.inline is not None else ([2, 16] if args.quick else [2, 16, 64])
    multi = args.multi if args.multi is not None else ([] if args.quick else [2, 4])
    import aiocollect

    run = h.Session("torch", "gymnasium", "anyio", aiocollect=aiocollect.__version__)
    run.header(
        f"bench_node_scaling: {repeats} fresh process(es) per row; DistributedCollector(sync=True, launcher='mp', "
        f"backend='gloo'), {NODE_FPB} CartPole frames per node and batch; MultiSyncCollector(backend='inline')",
        sys.executable,
    )
    plan = [("distributed", n) for n in nodes] + [(k, n) for n in multi for k in ("multi", "multi-exec")]
    plan += [("inline", n) for n in inline]

    def config(p: tuple[str, int], _rep: int) -> dict[str, Any]:
        return {"kind": p[0], "nodes": p[1], "warm": 2, "batches": 3 if args.quick else 6}

    def logged(p: tuple[str, int], rep: int, _cfg: dict[str, Any], r: dict[str, Any]) -> None:
        what = f"FAILED {r['error']}" if "error" in r else f"close {r['close_s'] * 1e3:.0f} ms"
        log(f"  round {rep + 1} {p[0]} x{p[1]}: {what}")

    runs = h.fresh_rounds("bench_node_scaling", plan, repeats, config, 300.0, on_result=logged)
    rows: list[dict[str, Any]] = []
    for kind, n in plan:
        ok = [r for r in runs[(kind, n)] if "error" not in r]
        if not ok:
            continue
        rows.append(
            {
                "kind": kind,
                "label": LABELS[kind],
                "nodes": n,
                "close_s": h.median(r["close_s"] for r in ok),
                "gone_s": h.median(r["gone_s"] for r in ok) if all(r["gone_s"] is not None for r in ok) else None,
                **h.medians(ok, MEDIAN_KEYS),
                "node_mb": h.median(r["node_mb"] for r in ok) if all(r.get("node_mb") for r in ok) else None,
                "tree_mb": h.median(r["tree_mb"] for r in ok) if all(r.get("tree_mb") for r in ok) else None,
                "hb_steady_p99": h.median(r["hb_steady"]["p99_ms"] for r in ok),
                "hb_close_p99": h.median(r["hb_close"]["p99_ms"] for r in ok),
                "hb_close_max": max(r["hb_close"]["max_ms"] for r in ok),
                "leaks": [r["left_alive"] for r in ok if r["left_alive"]],
            }
        )
    for r in rows:
        base = h.find(rows, kind=r["kind"], nodes=2)
        r["close_vs_2"] = h.div(r["close_s"], base and base["close_s"])
    log("")
    for line in h.markdown_table(COLUMNS, rows):
        log(line)
    checks = h.Checks()
    checks.add_runs(runs)
    r16 = h.find(rows, kind="distributed", nodes=16)
    desc = f"16 nodes close within {TARGET_16_OVER_2}x of 2 nodes"
    if r16 is not None:
        x = r16["close_vs_2"]
        checks.add(desc, x <= TARGET_16_OVER_2, h.fmt_x(x))
    else:
        checks.add(desc, None, "needs rows for 2 and 16 nodes (--nodes 2 16)")
    for r in rows:
        if r["leaks"]:
            log(f"  LEAK: {r['label']} x{r['nodes']}: node processes alive 30 s after close: {r['leaks']}")
    checks.report()
    run.footer()
    run.write_json(args.json, rows=rows, checks=checks.as_json())
    return checks.exit_code(args.strict)


if __name__ == "__main__":
    sys.exit(main())
