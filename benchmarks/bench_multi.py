#!/usr/bin/env python
"""Multi-process collectors side by side: throughput, first batch, parent CPU, event-loop gaps.

Compares, in ONE run and on the same workloads (env + 64-64 MLP policy, 2 workers):

* the single-process bare loop (``_workloads.bare_loop``; the reference, ratio 1.00),
* gymnasium's ``AsyncVectorEnv`` driven by the same hand-written loop,
* aiocollect's ``MultiSyncCollector``, ``MultiAsyncCollector`` and ``AsyncCollector`` (their
  blocking twins in a plain ``for`` loop), and the async ``MultiSyncCollector`` under
  ``anyio.run`` with a 1 ms heartbeat task on the same event loop,
* TorchRL's ``MultiSyncCollector``, ``MultiAsyncCollector`` and ``AsyncCollector`` (skipped
  with a note if torchrl is missing).

Workloads: CartPole-v1 as a gymnasium SyncVectorEnv of 8 per worker, and a "heavy"
CartPole-like env (``_workloads.HeavyEnv``) whose step burns about 1 ms of CPU, 1 env per worker.
For every row it prints frames/s (median of N repeats after a warmup), the ratio to the bare
loop and to TorchRL's counterpart, the time from construction to the first batch (warm median
and cold), the time to shut down, and the parent process's CPU use while it waits for batches.
The output ends with a Markdown table and PASS/FAIL lines against the project's targets.

Usage::

    python benchmarks/bench_multi.py            # full run (about 7 min on 2 idle cores)
    python benchmarks/bench_multi.py --quick    # CI smoke (about 1 min on 2 idle cores)

See benchmarks/README.md for what each row means and the fairness rules.
"""

from __future__ import annotations

import functools
import gc
import math
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
import gymnasium as gym
import torch
from torch import nn

import aiocollect

# The sibling modules, from any cwd. Spawned workers re-import this module, and with it this
# path setup, so they can unpickle the policy and env factories of _workloads too.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as h
import _workloads as wl
from _harness import Col, Row, Run, Settings, log

NUM_WORKERS = 2
CARTPOLE_ENVS = 8  # per worker
TARGETS = {
    "heavy_vs_bare": 1.8,  # 2 workers on the heavy env vs the single-process bare loop
    "torchrl_ratio": 3.0,  # MultiSync / MultiAsync vs TorchRL's counterparts, CartPole x8
    "first_batch_ms": 1500.0,  # every aiocollect process-based row (warm median)
    "heartbeat_p99_ms": 5.0,  # the async MultiSync's event loop, construction to teardown
}
_TRL_NAMES = {  # 0.14 names first, then the legacy ones
    "MultiSync": ("MultiSyncCollector", "MultiSyncDataCollector"),
    "MultiAsync": ("MultiAsyncCollector", "MultiaSyncDataCollector"),
    "Async": ("AsyncCollector", "aSyncDataCollector"),
}

# --------------------------------------------------------------------------------------------
# Workloads. Everything a worker process needs is module level (picklable for spawn).
# --------------------------------------------------------------------------------------------

# AsyncVectorEnv's start method, fixed at import: importing torchrl switches the process-wide
# default to spawn, and 16 spawned interpreters that each import torch take most of a minute
# to start on 2 cores. fork is what a plain script on Linux gets (Python < 3.14).
ASYNC_VEC_CONTEXT = "fork" if "fork" in multiprocessing.get_all_start_methods() else multiprocessing.get_start_method()


def make_async_vec(env_fn: Callable[[], gym.Env], n: int) -> gym.vector.VectorEnv:
    """gymnasium's AsyncVectorEnv: one process per env, shared-memory observations, SAME_STEP
    autoreset so the bare loop records real transitions (terminal obs from ``final_obs``)."""
    return gym.vector.AsyncVectorEnv(
        [env_fn] * n, shared_memory=True, context=ASYNC_VEC_CONTEXT, autoreset_mode=wl.SAME_STEP
    )


@dataclass
class Workload:
    key: str
    title: str
    env_fn: Callable[[], Any]  # one worker's env: the bare loop and aiocollect's workers
    async_vec_fn: Callable[[], Any]  # all workers' envs as one gymnasium AsyncVectorEnv
    async_vec_label: str
    async_vec_procs: int
    trl_env_fn: Callable[[], Any]
    fpb: int  # frames per batch of ONE worker
    policy: nn.Module


def make_workloads(work: int) -> list[Workload]:
    torch.manual_seed(0)  # same MLP weights on every run
    heavy = functools.partial(wl.make_heavy, work)
    n_cp = NUM_WORKERS * CARTPOLE_ENVS
    cartpole = functools.partial(wl.make_env, "CartPole-v1")
    return [
        Workload(
            "cartpole8",
            f"CartPole-v1 x{CARTPOLE_ENVS}/worker",
            functools.partial(wl.make_vec, "CartPole-v1", CARTPOLE_ENVS),
            functools.partial(make_async_vec, cartpole, n_cp),
            f"gymnasium AsyncVectorEnv({n_cp} envs)",
            n_cp,
            functools.partial(wl.trl_vec, "CartPole-v1", CARTPOLE_ENVS),
            800,
            wl.DiscretePolicy(4, 2),
        ),
        Workload(
            "heavy",
            "Heavy (~1 ms/step) x1/worker",
            heavy,
            functools.partial(make_async_vec, heavy, NUM_WORKERS),
            f"gymnasium AsyncVectorEnv({NUM_WORKERS} envs)",
            NUM_WORKERS,
            functools.partial(wl.trl_heavy, work),
            100,
            wl.DiscretePolicy(4, 2),
        ),
    ]


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


def aio_iter(
    cls: Any, env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int, workers: int
) -> Iterator[Any]:
    kw: dict[str, Any] = {"frames_per_batch": fpb, "total_frames": total}
    if workers:
        kw["num_workers"] = workers
    with cls(env_fn, policy, **kw) as c:
        yield from c


def measure_async(env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int) -> Run:
    """The async MultiSyncCollector under anyio.run, with a 1 ms heartbeat task running from
    just before construction to the end of the ``async with`` block (teardown included)."""
    gc.collect()

    async def main() -> Run:
        hb = h.Heartbeat()
        async with anyio.create_task_group() as tg:
            tg.start_soon(hb.run)
            await anyio.sleep(0.01)  # let the heartbeat settle before construction starts
            clock = h.BatchClock()
            async with aiocollect.MultiSyncCollector(
                env_fn, policy, num_workers=NUM_WORKERS, frames_per_batch=fpb, total_frames=total
            ) as c:
                async for batch in c:
                    clock.batch(batch)
            clock.close()
            hb.stop()
        return clock.run(gaps=hb.phased(clock.t0, clock.t_first, clock.t_last))

    return anyio.run(main, backend="asyncio")


def torchrl_classes() -> tuple[dict[str, tuple[type, str]], str | None]:
    """TorchRL's multi-process collector classes by role, or ({}, reason) if unavailable."""
    try:
        import torchrl.collectors as trc
    except Exception as exc:
        return {}, f"{type(exc).__name__}: {exc}"
    out = {}
    for role, names in _TRL_NAMES.items():
        try:
            cls, name = h.first_attr(trc, names)
        except AttributeError:
            continue
        out[role] = (cls, f"torchrl.collectors.{name}")
    return out, None if out else "no multi-process collector class found in torchrl.collectors"


def torchrl_iter(
    cls: type, env_fn: Callable[[], Any], policy: nn.Module, fpb: int, total: int, workers: int
) -> Iterator[Any]:
    from tensordict.nn import TensorDictModule

    module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
    envs = [env_fn] * workers if workers else env_fn
    return h.iter_shutdown(cls(envs, module, frames_per_batch=fpb, total_frames=total))


def build_rows(w: Workload, forkserver: bool, quick: bool) -> list[Row]:
    """Bare loop, AsyncVectorEnv loop and aiocollect rows of one workload."""
    n, fpb, pol = NUM_WORKERS, w.fpb, w.policy

    def it(make: Callable[[int], Iterator[Any]]) -> Callable[[int], Run]:
        return lambda total: h.measure_iter(lambda: make(total))

    def aio(cls: Any, fpb: int, workers: int) -> Callable[[int], Run]:
        return it(lambda t: aio_iter(cls, w.env_fn, pol, fpb, t, workers))

    rows = [
        Row(w.key, "bare loop (1 process)", "bare", it(lambda t: wl.bare_loop(w.env_fn, pol, fpb, t)), fpb),
        Row(w.key, w.async_vec_label + " + loop", "gym", it(lambda t: wl.bare_loop(w.async_vec_fn, pol, n * fpb, t)),
            n * fpb, procs=w.async_vec_procs),
        Row(w.key, "aiocollect MultiSyncDataCollector", "aio", aio(aiocollect.MultiSyncDataCollector, n * fpb, n),
            n * fpb, "MultiSync", n),
        Row(w.key, "aiocollect MultiaSyncDataCollector", "aio", aio(aiocollect.MultiaSyncDataCollector, fpb, n),
            fpb, "MultiAsync", n),
    ]  # fmt: skip
    if not (quick and w.key == "heavy"):  # --quick: AsyncCollector on CartPole only
        runner = aio(aiocollect.aSyncDataCollector, fpb, 0)
        rows.append(Row(w.key, "aiocollect aSyncDataCollector", "aio", runner, fpb, "Async", 1))
    runner = lambda t: measure_async(w.env_fn, pol, n * fpb, t)  # noqa: E731
    rows.append(Row(w.key, "aiocollect MultiSyncCollector (async)", "aio_async", runner, n * fpb, "MultiSync", n))
    if forkserver:
        # Informational: workers forked from a forkserver (aiocollect sets its preload list so
        # that the server imports torch & co. once) instead of spawned interpreters that import
        # them again (aiocollect's default start method).
        fs = functools.partial(aiocollect.MultiSyncDataCollector, start_method="forkserver")
        name = "aiocollect MultiSyncDataCollector (forkserver)"
        rows.append(Row(w.key, name, "aio_extra", aio(fs, n * fpb, n), n * fpb, None, n))
    return rows


def build_torchrl_rows(w: Workload, classes: dict[str, tuple[type, str]], roles: list[str]) -> list[Row]:
    rows = []
    for role in roles:
        if role not in classes:
            continue
        cls, full = classes[role]
        workers = 0 if role == "Async" else NUM_WORKERS
        fpb = NUM_WORKERS * w.fpb if role == "MultiSync" else w.fpb

        def runner(t: int, cls: type = cls, workers: int = workers, fpb: int = fpb) -> Run:
            return h.measure_iter(lambda: torchrl_iter(cls, w.trl_env_fn, w.policy, fpb, t, workers))

        rows.append(Row(w.key, "TorchRL " + full.rsplit(".", 1)[-1], "torchrl", runner, fpb, role, workers or 1))
    return rows


def check_leaks(row: Row, r: Run) -> None:
    """After every run: the collector's (or env's) child processes must be gone within 3 s."""
    left = h.wait_children_gone()
    if left:
        r.leaked = left
        row.leaks += left
        log(f"  WARNING: {row.name}: {len(left)} child process(es) alive after shutdown: {left}")


def detail(r: Run) -> str:
    return f"  close {r.close_s * 1e3:5.0f} ms  parent CPU {r.cpu_util * 100:4.0f}%"


def heartbeat_summary(row: Row) -> dict[str, float]:
    gaps = [pg for r in row.runs for pg in r.gaps]
    if not gaps:
        return {}
    out = h.gap_summary([g for _, g in gaps])
    for phase, label in enumerate(("startup", "steady", "teardown")):
        sel = [g * 1e3 for p, g in gaps if p == phase]
        out[f"{label}_p99_ms"] = h.percentile(sel, 99)
        out[f"{label}_max_ms"] = max(sel, default=math.nan)
    return out


# --------------------------------------------------------------------------------------------
# Main and the output tables (their columns: a heading and how a result record becomes the cell)
# --------------------------------------------------------------------------------------------

RESULT_COLUMNS = [
    Col("workload", "{workload}", 29, left=True),
    Col("row", "{row}", 46, left=True),
    Col("procs", "{env_procs}", 5),
    Col("fpb", "{frames_per_batch}", 5),
    Col("frames/s", "{fps:.0f}", 9),
    Col("x bare", h.ratio("vs_bare"), 7),
    Col("x TorchRL", h.ratio("vs_torchrl"), 9),
    Col("1st ms", "{first_ms:.0f}", 7),
    Col("cold ms", "{cold_first_ms:.0f}", 8),
    Col("close ms", "{close_ms:.0f}", 8),
    Col("parent CPU", lambda t: f"{t['parent_cpu'] * 100:.0f}%", 10),
    Col("spread", lambda t: f"{t['spread'] * 100:.1f}%", 7),
    Col("ep len", "{ep_len:.1f}", 7),
]
MARKDOWN_COLUMNS = [
    Col("workload", "{workload}", left=True),
    Col("collector", "{row}", left=True),
    Col("env procs", "{env_procs}"),
    Col("frames/s", "{fps:,.0f}"),
    Col("vs bare loop", h.ratio("vs_bare")),
    Col("vs TorchRL", h.ratio("vs_torchrl", "-")),
    Col("first batch (ms)", "{first_ms:,.0f}"),
    Col("cold first batch (ms)", "{cold_first_ms:,.0f}"),
    Col("parent CPU", lambda t: f"{t['parent_cpu'] * 100:.0f}%"),
]


def parse_args(argv: list[str] | None) -> Any:
    ap = h.parser(
        __doc__,
        quick="short CI smoke run (about 1 min), noisy",
        repeats="timed runs per row (default 3; 1 with --quick)",
        target_seconds="approximate steady-state length of one timed run (default 1.0; 0.3 with --quick)",
        no_torchrl="skip the TorchRL rows",
    )
    ap.add_argument(
        "--workload", action="append", choices=["cartpole8", "heavy"], help="run only this workload (repeatable)"
    )
    ap.add_argument(
        "--heavy-work",
        type=int,
        default=wl.HEAVY_WORK,
        help=f"iterations of pure-Python work per heavy step (default {wl.HEAVY_WORK}, ~1 ms)",
    )
    ap.add_argument(
        "--torchrl-start-method",
        choices=["spawn", "fork", "forkserver"],
        default="spawn",
        help="multiprocessing start method for the TorchRL rows (default spawn, what `import "
        "torchrl` selects on Linux in a fresh process)",
    )
    ap.add_argument(
        "--no-forkserver-row",
        dest="forkserver_row",
        action="store_false",
        help="skip the informational MultiSync start_method='forkserver' row (full run, CartPole)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    st = Settings.of_args(args)
    args.forkserver_row = args.forkserver_row and not quick
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    trl_missing = h.torchrl_note(args.no_torchrl)  # no import: it would change the start method
    run = h.Session("torch", "tensordict", "gymnasium", "anyio", "torchrl", aiocollect=aiocollect.__version__)
    if trl_missing is not None:
        run.versions["torchrl"] = "not used"
    mode = "QUICK (AsyncCollector and TorchRL MultiSync on CartPole only)" if quick else "full"
    after = "after a warmup" if st.warm_batches else "(no warmup run: cold = warm)"
    burn_ms, burn_min = wl.heavy_step_ms(args.heavy_work)
    run.header(
        f"bench_multi: {mode} run, {st.repeats} timed runs/row {after}, "
        f"~{st.target_s:g} s of steady state each, {NUM_WORKERS} workers",
        f"torch threads={torch.get_num_threads()}, AsyncVectorEnv start method={ASYNC_VEC_CONTEXT}",
        *([f"NOTE: TorchRL rows skipped ({trl_missing})"] if trl_missing else []),
        f"heavy env: {args.heavy_work} work iterations per step = {burn_ms:.2f} ms of CPU here "
        f"(median; fastest {burn_min:.2f} ms)",
    )
    pre_children, _ = h.live_children()
    if pre_children:
        log(f"  NOTE: child processes alive before the benchmark: {pre_children}")

    workloads = [w for w in make_workloads(args.heavy_work) if not args.workload or w.key in args.workload]
    titles = {w.key: w.title for w in workloads}
    rows: list[Row] = []

    phase = time.perf_counter()
    log("\n[1/2] bare loop, gymnasium AsyncVectorEnv and aiocollect (round robin per workload)")
    for w in workloads:
        wrows = build_rows(w, args.forkserver_row and w.key == "cartpole8", quick)
        h.run_rows(wrows, st, check_leaks, detail)
        rows += wrows
    log(f"  ({time.perf_counter() - phase:.1f} s)")

    if trl_missing is None:
        # Last, so that importing and running TorchRL cannot disturb the other rows.
        phase = time.perf_counter()
        h.torchrl_note(False, import_it=True)  # silences its INFO chatter
        classes, trl_missing = torchrl_classes()
    if trl_missing is not None:
        log(f"\n[2/2] TorchRL rows skipped ({trl_missing})")
    else:
        # `import torchrl` sets the process-wide start method to spawn, but only if nothing
        # fixed it before, and every spawn-context Process.start() (aiocollect's workers) fixes
        # it to the platform default (fork on Linux). Restore what TorchRL would get in a fresh
        # script, so its rows do not silently run with fork.
        before = multiprocessing.get_start_method(allow_none=True)
        multiprocessing.set_start_method(args.torchrl_start_method, force=True)
        log(
            "\n[2/2] TorchRL (" + ", ".join(full for _, full in classes.values()) + "), "
            f"start method {args.torchrl_start_method} (was {before})"
        )
        for w in workloads:
            roles = list(_TRL_NAMES)
            if quick:  # TorchRL's process start alone takes seconds: keep the smallest check
                roles = ["MultiSync"] if w.key == "cartpole8" else []
            trows = build_torchrl_rows(w, classes, roles)
            h.run_rows(trows, st, check_leaks, detail)
            rows += trows
        log(f"  ({time.perf_counter() - phase:.1f} s)")

    by_wl = {w.key: [r for r in rows if r.group == w.key] for w in workloads}

    def find(wl_key: str, kind: str, role: str | None = None) -> Row | None:
        return h.find(by_wl.get(wl_key, []), kind=kind, role=role)

    table = results_table(workloads, by_wl, find)
    heart = {titles[r.group]: heartbeat_summary(r) for r in rows if r.kind == "aio_async"}
    heart = {k: v for k, v in heart.items() if v}
    if heart:
        c0, t0 = time.process_time(), time.perf_counter()
        idle = h.gap_summary(anyio.run(h.idle_gaps, 1.0))
        # The heartbeat's own cost, included in the async row's parent CPU.
        heart["idle loop (reference)"] = {**idle, "cpu": (time.process_time() - c0) / (time.perf_counter() - t0)}

    checks = h.Checks()
    targets(checks, rows, by_wl, find, titles, heart)
    # Leftover processes after everything was shut down.
    gc.collect()
    left = h.wait_children_gone(5.0)
    _, helpers = h.live_children()
    leaked_rows = [r.name + f" ({titles[r.group]})" for r in rows if r.leaks]
    clean = not left and not leaked_rows
    detail_ = "none" if clean else f"alive now: {left}; rows that leaked: {leaked_rows}"
    checks.add("no worker process left alive after shutdown", clean, detail_)

    report(table, heart, st, after)
    checks.report()
    if left:
        log(f"  WARNING: child processes still alive at exit: {left}")
    if helpers:
        log(f"  (long-lived multiprocessing helpers, not counted as leaks: {helpers})")
    markdown(table, heart, st, after, run, burn_ms)
    run.footer("this benchmark adds about 2")
    settings = {
        "quick": quick,
        "repeats": st.repeats,
        "target_seconds": st.target_s,
        "num_workers": NUM_WORKERS,
        "heavy_work": args.heavy_work,
        "heavy_step_ms": burn_ms,
        "async_vector_env_start_method": ASYNC_VEC_CONTEXT,
        "torchrl_start_method": args.torchrl_start_method,
    }
    run.write_json(
        args.json, settings=settings, rows=table, heartbeat=heart, checks=checks.as_json(), children_left=left
    )
    return checks.exit_code(args.strict)


def results_table(workloads: list[Workload], by_wl: dict[str, list[Row]], find: Any) -> list[dict[str, Any]]:
    table: list[dict[str, Any]] = []
    for w in workloads:
        bare = find(w.key, "bare")
        for r in by_wl[w.key]:
            trl = find(w.key, "torchrl", r.role) if r.role and r.kind.startswith("aio") else None
            table.append(
                {
                    "workload": w.title,
                    "row": r.name,
                    "kind": r.kind,
                    "env_procs": r.procs,
                    "frames_per_batch": r.fpb,
                    "fps": r.fps,
                    "vs_bare": h.div(r.fps, bare and bare.fps),
                    "vs_torchrl": h.div(r.fps, trl and trl.fps),
                    "vs_torchrl_row": trl.name if trl else None,
                    "first_ms": r.first_ms,
                    "cold_first_ms": r.cold_ms,
                    "close_ms": r.med("close_s") * 1e3,
                    "parent_cpu": r.med("cpu_util"),
                    "spread": r.spread,
                    "ep_len": r.ep_len,
                    "frames_per_run": r.total,
                    "runs_fps": [x.fps for x in r.runs],
                    "runs_first_ms": [x.first_s * 1e3 for x in r.runs],
                    "leaked": r.leaks,
                }
            )
    return table


def targets(
    checks: h.Checks, rows: list[Row], by_wl: dict[str, list[Row]], find: Any, titles: dict[str, str], heart: Any
) -> None:
    heavy_bare = find("heavy", "bare")
    if heavy_bare is not None:
        need = TARGETS["heavy_vs_bare"]
        for r in by_wl["heavy"]:
            if r.kind in ("aio", "aio_async") and r.procs == NUM_WORKERS:
                x = r.fps / heavy_bare.fps
                desc = f"Heavy: {r.name} ({NUM_WORKERS} workers) >= {need}x single-process bare loop"
                checks.add(desc, x >= need, f"{x:.2f}x ({r.fps:.0f} vs {heavy_bare.fps:.0f} frames/s)")
    for r in by_wl.get("cartpole8", []):
        if r.kind in ("aio", "aio_async") and r.role in ("MultiSync", "MultiAsync"):
            desc = f"CartPole x8: {r.name} >= {TARGETS['torchrl_ratio']:g}x TorchRL {r.role}"
            trl = find("cartpole8", "torchrl", r.role)
            if trl is None:
                checks.add(desc, None, "TorchRL counterpart not run")
            else:
                x = r.fps / trl.fps
                val = f"{x:.2f}x ({r.fps:.0f} vs {trl.fps:.0f} frames/s)"
                checks.add(desc, x >= TARGETS["torchrl_ratio"], val)
    limit = TARGETS["first_batch_ms"]
    for r in rows:
        if r.kind in ("aio", "aio_async"):
            val = f"{r.first_ms:.0f} ms (cold {r.cold_ms:.0f} ms)"
            checks.add(f"{titles[r.group]}: {r.name} first batch < {limit:.0f} ms", r.first_ms < limit, val)
    lim = TARGETS["heartbeat_p99_ms"]
    for label, v in heart.items():
        if not label.startswith("idle"):
            desc = f"{label}: async MultiSyncCollector event-loop heartbeat p99 <= {lim:g} ms"
            checks.add(desc, v["p99_ms"] <= lim, f"p99 {v['p99_ms']:.2f} ms, max {v['max_ms']:.1f} ms")


def report(table: list[dict[str, Any]], heart: dict[str, Any], st: Settings, after: str) -> None:
    log("\n" + "=" * 120)
    log(
        f"RESULTS: frames/s = median of {st.repeats} timed runs {after} (steady state, "
        "first batch excluded); 1st ms = median time from construction to the first batch"
    )
    for line in h.console_table(RESULT_COLUMNS, table):
        log(line)
    log("  procs: env processes (0 = all in this process). fpb: frames per batch as the caller")
    log("  sees it. x TorchRL: vs TorchRL's class of the same role (MultiSync/MultiAsync/Async).")
    log("  cold ms: first batch of the row's first construction in this process. close ms: last")
    log("  batch -> shut down. parent CPU: this process's CPU time (all threads) / wall time while")
    log("  batches arrive (100% = one core). ep len: frames per episode end (rows collect alike).")
    if heart:
        log(
            "\nEvent-loop responsiveness: gap between wakeups of a task doing "
            "'await anyio.sleep(0.001)'\non the loop of the async MultiSyncCollector, from "
            "construction to the end of teardown"
        )
        for label, v in heart.items():
            phases = ""
            if "steady_max_ms" in v:
                phases = (
                    f"\n  {'':<29} steady state only: p99 {v['steady_p99_ms']:.2f} ms; max gap by "
                    f"phase: startup {v['startup_max_ms']:.1f}, steady {v['steady_max_ms']:.1f}, "
                    f"teardown {v['teardown_max_ms']:.1f} ms"
                )
            if "cpu" in v:
                phases = f", the heartbeat alone uses {v['cpu'] * 100:.0f}% CPU"
            log(h.gap_line(label, v, 29, after=phases))


def markdown(
    table: list[dict[str, Any]], heart: dict[str, Any], st: Settings, after: str, run: h.Session, burn_ms: float
) -> None:
    md = h.markdown_table(MARKDOWN_COLUMNS, table)
    if heart:
        cols = h.gap_columns("event loop of the async MultiSyncCollector")
        md += ["", *h.markdown_table(cols, [{"label": k, **v} for k, v in heart.items()])]
    run.markdown(
        md,
        f", {NUM_WORKERS} workers, torch.set_num_threads(1); heavy step {burn_ms:.2f} ms; frames/s is the median "
        f"of {st.repeats} timed runs {after}; first batch is the time from construction to the first batch in hand",
    )


if __name__ == "__main__":  # the guard matters: spawned workers re-import this module
    sys.exit(main())
