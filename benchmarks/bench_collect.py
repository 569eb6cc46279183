#!/usr/bin/env python
"""Throughput, first-batch latency and event-loop responsiveness of aiocollect.

Compares, in ONE process and on the same workloads (env + 64-64 MLP policy):

* a bare hand-written collection loop (``_workloads.bare_loop``: no framework, numpy writes into
  preallocated torch storage, one ``no_grad`` per batch; the reference, ratio 1.00),
* aiocollect's blocking ``SyncDataCollector`` and async ``Collector`` (asyncio and uvloop),
* TorchRL's ``torchrl.collectors.Collector`` (skipped with a note if torchrl is missing).

For every row it prints frames/s (median of N repeats after a warmup), the ratio to the bare
loop of the same workload, the ratio to TorchRL, and the time from construction to the first
batch in hand. For the async collector on CartPole-v1 x8 it also measures how late a 1 ms
heartbeat task on the same event loop wakes up while collection runs. The result ends with a
Markdown table and PASS/FAIL lines against the project's targets.

Usage::

    python benchmarks/bench_collect.py            # full run (< 3 min on 2 cores)
    python benchmarks/bench_collect.py --quick    # CI smoke (< 30 s)
    python benchmarks/bench_collect.py --paired 20  # bare loop vs SyncDataCollector, alternating

See benchmarks/README.md for what each row means and the fairness rules.
"""

from __future__ import annotations

import functools
import gc
import math
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
import _workloads as wl
from _harness import Col, Row, Run, Settings, log

FPB = 800  # frames per batch, every row
TARGETS = {"bare_ratio": 0.85, "torchrl_ratio": 5.0, "first_batch_ms": 500.0}
SAME_STEP, NEXT_STEP = wl.SAME_STEP, wl.NEXT_STEP

# --------------------------------------------------------------------------------------------
# Workloads: the env factories and the policy, shared verbatim by every row.
# --------------------------------------------------------------------------------------------


@dataclass
class Workload:
    key: str
    title: str
    env_id: str
    num_envs: int  # 0 = a single (unbatched) gymnasium Env
    policy: nn.Module

    def env_fn(self, mode: gym.vector.AutoresetMode = SAME_STEP) -> Callable[[], Any]:
        if self.num_envs:
            return functools.partial(wl.make_vec, self.env_id, self.num_envs, mode)
        return functools.partial(wl.make_env, self.env_id)


def make_workloads() -> list[Workload]:
    torch.manual_seed(0)  # same MLP weights on every run
    return [
        Workload("cartpole1", "CartPole-v1 x1", "CartPole-v1", 0, wl.DiscretePolicy(4, 2)),
        Workload("cartpole8", "CartPole-v1 x8 (SyncVectorEnv)", "CartPole-v1", 8, wl.DiscretePolicy(4, 2)),
        Workload("pendulum1", "Pendulum-v1 x1", "Pendulum-v1", 0, wl.ContinuousPolicy(3, 1)),
    ]


# --------------------------------------------------------------------------------------------
# The rows: the bare loop (_workloads.bare_loop), aiocollect, TorchRL
# --------------------------------------------------------------------------------------------


def aio_blocking(env_fn: Callable[[], Any], policy: nn.Module, total: int) -> Iterator[Any]:
    with aiocollect.SyncDataCollector(env_fn, policy, frames_per_batch=FPB, total_frames=total) as c:
        yield from c


def measure_async(
    env_fn: Callable[[], Any], policy: nn.Module, total: int, *, uvloop: bool, heartbeat: bool = False
) -> Run:
    """The async Collector under ``anyio.run``; with ``heartbeat``, a 1 ms heartbeat task on the
    same loop from just before construction to the end of the ``async with`` block."""
    gc.collect()  # as h.measure_iter does for every other row

    async def main() -> Run:
        hb = h.Heartbeat()
        async with anyio.create_task_group() as tg:
            if heartbeat:
                tg.start_soon(hb.run)
                await anyio.sleep(0.01)  # let the heartbeat settle before construction starts
            clock = h.BatchClock()
            async with aiocollect.Collector(env_fn, policy, frames_per_batch=FPB, total_frames=total) as c:
                async for batch in c:
                    clock.batch(batch)
            clock.close()
            hb.stop()
        return clock.run(gaps=[(1, g) for g in hb.gaps(clock.t0)] if heartbeat else [])

    return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True} if uvloop else {})


def verify_same_data(w: Workload, batches: int = 2) -> str | None:
    """Check that the bare loop and aiocollect produce identical transitions from seeded envs.

    Returns None when obs, action, next obs, reward, done, terminated and truncated match bit
    for bit, else a description of the first difference. This is what makes the bare loop a
    fair reference.
    """
    base = w.env_fn(SAME_STEP)

    def seeded() -> Any:
        env = base()
        env.reset(seed=1234)  # both collectors then continue the same env RNG stream
        return env

    bare = list(wl.bare_loop(seeded, w.policy, FPB, batches * FPB, same_step=True))
    with aiocollect.SyncDataCollector(seeded, w.policy, frames_per_batch=FPB, total_frames=batches * FPB) as c:
        aio = list(c)
    if len(aio) != len(bare):
        return f"{len(aio)} aiocollect batches vs {len(bare)} bare batches"
    pairs = [
        ("observation", "observation"),
        ("action", "action"),
        ("next_observation", ("next", "observation")),
        ("reward", ("next", "reward")),
        ("done", ("next", "done")),
        ("terminated", ("next", "terminated")),
        ("truncated", ("next", "truncated")),
    ]
    for i, (b, a) in enumerate(zip(bare, aio, strict=True)):
        for bk, ak in pairs:
            av = a[ak]
            if bk in ("reward", "done", "terminated", "truncated"):
                av = av.squeeze(-1)
            bv = b[bk].movedim(0, 1) if w.num_envs else b[bk]  # [T, N] -> TorchRL's [N, T]
            if bv.shape != av.shape or not torch.equal(bv.to(av.dtype), av):
                return f"batch {i}: {bk!r} differs"
    return None


def torchrl_collector_class() -> tuple[type, str]:
    import torchrl.collectors as trc

    cls, name = h.first_attr(trc, ("Collector", "SyncDataCollector"))
    return cls, f"torchrl.collectors.{name}"


def torchrl_env_fn(w: Workload, variant: str) -> Callable[[], Any]:
    if variant == "single":
        return functools.partial(wl.trl_env, w.env_id)
    if variant == "wrapper":
        return functools.partial(wl.trl_vec, w.env_id, w.num_envs)
    from torchrl.envs import GymEnv, SerialEnv

    if variant == "serial":
        return lambda: SerialEnv(w.num_envs, functools.partial(wl.trl_env, w.env_id))
    if variant == "num_envs":
        # GymEnv(..., num_envs=n) builds a gymnasium *AsyncVectorEnv*: n subprocesses.
        return lambda: GymEnv(w.env_id, num_envs=w.num_envs, categorical_action_encoding=True)
    raise ValueError(variant)


def torchrl_iter(w: Workload, variant: str, total: int) -> Iterator[Any]:
    from tensordict.nn import TensorDictModule

    cls, _ = torchrl_collector_class()
    policy = TensorDictModule(w.policy, in_keys=["observation"], out_keys=["action"])
    return h.iter_shutdown(cls(torchrl_env_fn(w, variant), policy, frames_per_batch=FPB, total_frames=total))


def build_rows(workloads: list[Workload], quick: bool) -> list[Row]:
    """Bare-loop and aiocollect rows (TorchRL rows are built separately)."""

    def bare(f: Callable[[], Any], p: nn.Module, same_step: bool) -> Callable[[int], Run]:
        return lambda n: h.measure_iter(lambda: wl.bare_loop(f, p, FPB, n, same_step=same_step))

    def blocking(f: Callable[[], Any], p: nn.Module) -> Callable[[int], Run]:
        return lambda n: h.measure_iter(lambda: aio_blocking(f, p, n))

    def async_(f: Callable[[], Any], p: nn.Module, uvloop: bool) -> Callable[[int], Run]:
        return lambda n: measure_async(f, p, n, uvloop=uvloop)

    rows: list[Row] = []
    for w in workloads:
        ss, ns, pol, vec = w.env_fn(SAME_STEP), w.env_fn(NEXT_STEP), w.policy, bool(w.num_envs)
        candidates = [
            (True, "bare loop", "bare", bare(ss, pol, True)),
            (vec, "bare (next-step, phantom frames)", "bare_next", bare(ns, pol, False)),
            (True, "aiocollect SyncDataCollector", "aio", blocking(ss, pol)),
            (vec or not quick, "aiocollect Collector (asyncio)", "aio", async_(ss, pol, False)),
            (vec or not quick, "aiocollect Collector (uvloop)", "aio", async_(ss, pol, True)),
            (vec and not quick, "aiocollect SyncDataCollector, next-step env", "aio_extra", blocking(ns, pol)),
        ]
        rows += [Row(w.key, name, kind, run, FPB) for on, name, kind, run in candidates if on]
    return rows


def build_torchrl_rows(workloads: list[Workload], quick: bool, subproc: bool) -> list[Row]:
    short = torchrl_collector_class()[1].rsplit(".", 1)[-1]
    rows: list[Row] = []
    for w in workloads:
        if quick and not w.num_envs:
            continue
        variants = [("single", "torchrl", "GymEnv")]
        if w.num_envs:
            variants = [("wrapper", "torchrl", "GymWrapper(SyncVectorEnv)")]
            if not quick:
                variants.append(("serial", "torchrl_extra", "SerialEnv(8, GymEnv)"))
            if subproc:
                variants.append(("num_envs", "torchrl_extra", "GymEnv num_envs=8, subproc"))
        for variant, kind, label in variants:
            runner = functools.partial(lambda n, w, v: h.measure_iter(lambda: torchrl_iter(w, v, n)), w=w, v=variant)
            rows.append(Row(w.key, f"TorchRL {short} ({label})", kind, runner, FPB))
    return rows


def responsiveness(w8: Workload, bare_fps: float, target_s: float) -> dict[str, dict[str, float]]:
    """Heartbeat gaps while the async collector runs CartPole x8, under asyncio and uvloop."""
    total = max(3, min(400, round(max(target_s, 0.5) * bare_fps / FPB) + 1)) * FPB
    out: dict[str, dict[str, float]] = {}
    for label, uv in (("asyncio", False), ("uvloop", True)):
        run = measure_async(w8.env_fn(SAME_STEP), w8.policy, total, uvloop=uv, heartbeat=True)
        out[label] = {**h.gap_summary([g for _, g in run.gaps]), "fps": run.fps}
    out["idle loop (reference)"] = {**h.gap_summary(anyio.run(h.idle_gaps)), "fps": math.nan}
    return out


# --------------------------------------------------------------------------------------------
# Paired mode
# --------------------------------------------------------------------------------------------


def paired(w: Workload, pairs: int) -> tuple[list[float], list[float]]:
    """Seconds per batch of the bare loop and of SyncDataCollector, single batches alternating in
    one process.

    Both run side by side from the start, so a drift of the machine's speed (±20% from
    minute to minute on a small VM) hits both alike: each pair times one batch of each, in
    alternating order (ABBA); a pair's ratio is bare-loop time over SyncDataCollector time.
    """
    bare = wl.bare_loop(w.env_fn(), w.policy, FPB, 10**15, same_step=True)
    with aiocollect.SyncDataCollector(w.env_fn(), w.policy, frames_per_batch=FPB, total_frames=-1) as c:
        aio = iter(c)
        for _ in range(3):  # warm-up: allocation, first-call costs
            next(bare), next(aio)
        t_bare, t_aio = h.abba(lambda: h.timed(bare.__next__), lambda: h.timed(aio.__next__), pairs)
    bare.close()
    return t_bare, t_aio


def paired_async(w: Workload, pairs: int, uvloop: bool) -> tuple[list[float], list[float]]:
    """`paired` for the async Collector: its batches awaited on an event loop (asyncio, or uvloop),
    alternating with batches of the bare loop run in the same thread (ABBA)."""

    async def main() -> tuple[list[float], list[float]]:
        bare = wl.bare_loop(w.env_fn(), w.policy, FPB, 10**15, same_step=True)
        out: tuple[list[float], list[float]] = ([], [])
        async with aiocollect.Collector(w.env_fn(), w.policy, frames_per_batch=FPB, total_frames=-1) as c:
            it = c.__aiter__()
            for _ in range(3):
                next(bare)
                await it.__anext__()
            for _, side in h.abba_order(pairs):
                t = time.perf_counter()
                if side == 0:
                    next(bare)
                else:
                    await it.__anext__()
                out[side].append(time.perf_counter() - t)
        bare.close()
        return out

    return anyio.run(main, backend="asyncio", backend_options={"use_uvloop": True} if uvloop else {})


def paired_loop(w: Workload, pairs: int) -> tuple[list[float], list[float]]:
    """`paired` for the step loop alone: the collector's ``Rollout.collect`` called in this thread.

    No portal, no lane thread: the gap between this row and SyncDataCollector's is what the
    hand-offs between threads cost, the gap between this row and 1.00x the loop's own work.
    """
    bare = wl.bare_loop(w.env_fn(), w.policy, FPB, 10**15, same_step=True)
    with aiocollect.SyncDataCollector(w.env_fn(), w.policy, frames_per_batch=FPB, total_frames=-1) as c:
        next(iter(c))  # builds the env and the rollout's storage
        rollout = c._async._rollout  # internal: this row is a diagnostic

        def collect() -> None:
            rollout.collect(False)

        for _ in range(3):
            next(bare), collect()
        t_bare, t_loop = h.abba(lambda: h.timed(bare.__next__), lambda: h.timed(collect), pairs)
    bare.close()
    return t_bare, t_loop


PAIRED_KINDS = (
    ("SyncDataCollector", lambda w, n: paired(w, n)),
    ("Collector (asyncio)", lambda w, n: paired_async(w, n, False)),
    ("Collector (uvloop)", lambda w, n: paired_async(w, n, True)),
    ("step loop only", lambda w, n: paired_loop(w, n)),
)


def run_paired(workloads: list[Workload], pairs: int) -> dict[str, dict[str, float]]:
    log(f"\npaired: {pairs} alternating batch pairs per workload and collector (ratio = aiocollect speed / bare loop)")
    out = {}
    for w in workloads:
        for name, measure in PAIRED_KINDS:
            t_bare, t_aio = measure(w, pairs)
            key = w.title if name == "SyncDataCollector" else f"{w.title}, {name}"
            out[key] = h.ratio_summary(h.pair_ratios(t_bare, t_aio))
            out[key].update(
                # Each side's fastest tenth of batches: a VM's interference only ever slows a batch
                # down, so these are its least disturbed ones (timeit takes the minimum for the same
                # reason; a quantile is less at the mercy of one lucky batch).
                fast=h.percentile(t_bare, 10) / h.percentile(t_aio, 10),
                bare_us=h.median(t_bare) / FPB * 1e6,
                aio_us=h.median(t_aio) / FPB * 1e6,
                kind=name,
                workload=w.title,
            )
    cols = [
        Col("workload", "{workload}", left=True),
        Col("collector", "{kind}", left=True),
        *(Col(k, h.ratio(k)) for k in ("median", "p25", "p75", "min", "max")),
        Col("fastest 10%", h.ratio("fast")),
        Col("bare loop us/frame", "{bare_us:.1f}"),
        Col("aiocollect us/frame", "{aio_us:.1f}"),
    ]
    rows = list(out.values())
    log("\n" + "\n".join(h.markdown_table(cols, rows)))
    return out


# --------------------------------------------------------------------------------------------
# Main and the output tables (their columns: a heading and how a result record becomes the cell)
# --------------------------------------------------------------------------------------------

RESULT_COLUMNS = [
    Col("workload", "{workload}", 30, left=True),
    Col("row", "{row}", 46, left=True),
    Col("frames/s", "{fps:.0f}", 9),
    Col("x bare", h.ratio("vs_bare"), 7),
    Col("x TorchRL", h.ratio("vs_torchrl"), 9),
    Col("1st ms", "{first_ms:.0f}", 7),
    Col("cold ms", "{cold_first_ms:.0f}", 8),
    Col("spread", lambda t: f"{t['spread'] * 100:.1f}%", 7),
    Col("ep len", "{ep_len:.1f}", 7),
    Col("CPU fr/s", "{cpu_fps:.0f}", 9),
    Col("CPU x bare", h.ratio("cpu_vs_bare"), 10),
]
MARKDOWN_COLUMNS = [
    Col("workload", "{workload}", left=True),
    Col("collector", "{row}", left=True),
    Col("frames/s", "{fps:,.0f}"),
    Col("vs bare loop", h.ratio("vs_bare")),
    Col("vs TorchRL", h.ratio("vs_torchrl", "-")),
    Col("first batch (ms)", "{first_ms:.0f}"),
]


def parse_args(argv: list[str] | None) -> Any:
    ap = h.parser(
        __doc__,
        quick="short CI smoke run (< 30 s), noisy",
        repeats="timed runs per row (default 3)",
        target_seconds="approximate length of one timed run (default 1.0; 0.1 with --quick)",
        no_torchrl="skip the TorchRL rows",
    )
    ap.add_argument(
        "--workload",
        action="append",
        choices=["cartpole1", "cartpole8", "pendulum1"],
        help="run only this workload (repeatable); the targets need cartpole8",
    )
    ap.add_argument(
        "--torchrl-subproc",
        action="store_true",
        help="also run TorchRL's GymEnv(num_envs=8): a gymnasium AsyncVectorEnv, 8 subprocesses",
    )
    ap.add_argument(
        "--no-verify",
        action="store_true",
        help="skip checking that the bare loop and aiocollect produce identical data",
    )
    ap.add_argument(
        "--paired",
        type=int,
        metavar="N",
        help="only the paired mode: N alternating batches of the bare loop and each collector (the blocking "
        "SyncDataCollector, the async Collector on asyncio and on uvloop, and the step loop alone, called in "
        "this thread) in one process; prints the median speed ratio (robust to machine drift)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    st = Settings(
        repeats=args.repeats or 3,
        target_s=args.target_seconds or (0.1 if quick else 1.0),
        min_batches=2 if quick else 3,
        warm_batches=1 if quick else 3,
    )
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    trl_missing = h.torchrl_note(args.no_torchrl, import_it=True)
    run = h.Session("torch", "tensordict", "gymnasium", "anyio", "uvloop", "torchrl", aiocollect=aiocollect.__version__)
    if trl_missing is not None:
        run.versions["torchrl"] = "not used"
    mode = "QUICK (async rows and TorchRL on CartPole x8 only)" if quick else "full"
    run.header(
        f"bench_collect: {mode} run, {st.repeats} timed runs/row after a warmup, ~{st.target_s:g} s each",
        f"torch threads={torch.get_num_threads()}, frames_per_batch={FPB}",
        *([f"NOTE: TorchRL rows skipped ({trl_missing})"] if trl_missing else []),
    )

    workloads = [w for w in make_workloads() if not args.workload or w.key in args.workload]
    if args.paired:
        summary = run_paired(workloads, args.paired)
        run.footer()
        run.write_json(args.json, paired=summary, pairs=args.paired)
        return 0
    titles = {w.key: w.title for w in workloads}
    checks = h.Checks()

    if not args.no_verify:
        log("\n[0/3] same-data check: bare loop vs aiocollect on seeded envs")
        for w in workloads:
            if quick and not w.num_envs:
                continue
            err = verify_same_data(w)
            log(f"  {w.title:<32} {'identical transitions' if err is None else 'MISMATCH: ' + err}")
            if err is not None:
                checks.add(f"{w.title}: bare loop and aiocollect collect identical data", False, err)

    rows = build_rows(workloads, quick)
    phase = time.perf_counter()
    log("\n[1/3] bare loop and aiocollect")
    for w in workloads:
        h.run_rows([r for r in rows if r.group == w.key], st)
    log(f"  ({time.perf_counter() - phase:.1f} s)")

    if trl_missing is None:
        # Last, so that importing and running TorchRL cannot disturb the other rows.
        phase = time.perf_counter()
        log(f"\n[2/3] TorchRL ({torchrl_collector_class()[1]})")
        trl_rows = build_torchrl_rows(workloads, quick, args.torchrl_subproc)
        for w in workloads:
            h.run_rows([r for r in trl_rows if r.group == w.key], st)
        rows += trl_rows
        log(f"  ({time.perf_counter() - phase:.1f} s)")

    by_wl = {w.key: [r for r in rows if r.group == w.key] for w in workloads}

    def ref(wl_key: str, kind: str) -> Row | None:
        return h.find(by_wl.get(wl_key, []), kind=kind)

    resp: dict[str, dict[str, float]] = {}
    b8 = ref("cartpole8", "bare")
    if b8 is not None:
        log("\n[3/3] event-loop responsiveness: async Collector on CartPole x8 + 1 ms heartbeat")
        resp = responsiveness(next(w for w in workloads if w.key == "cartpole8"), b8.fps, st.target_s)

    table = results_table(workloads, by_wl, ref)
    targets(checks, rows, by_wl, ref, titles)
    report(table, resp, st, by_wl, ref, workloads)
    checks.report()
    markdown(table, resp, st, run)
    run.footer("this benchmark adds about 1")
    run.write_json(args.json, rows=table, responsiveness=resp, checks=checks.as_json())
    return checks.exit_code(args.strict)


def results_table(workloads: list[Workload], by_wl: dict[str, list[Row]], ref: Any) -> list[dict[str, Any]]:
    table = []
    for w in workloads:
        bare, trl = ref(w.key, "bare"), ref(w.key, "torchrl")
        for r in by_wl[w.key]:
            cpu_fps = r.med("cpu_fps")
            table.append(
                {
                    "workload": w.title,
                    "row": r.name,
                    "kind": r.kind,
                    "fps": r.fps,
                    "vs_bare": h.div(r.fps, bare and bare.fps),
                    "vs_torchrl": h.div(r.fps, trl.fps) if trl and r.kind.startswith(("aio", "bare")) else math.nan,
                    "first_ms": r.first_ms,
                    "cold_first_ms": r.cold_ms,
                    "spread": r.spread,
                    "ep_len": r.ep_len,
                    "cpu_fps": cpu_fps,
                    "cpu_vs_bare": h.div(cpu_fps, bare and bare.med("cpu_fps")),
                    "frames_per_run": r.total,
                    "runs_fps": [x.fps for x in r.runs],
                }
            )
    return table


def targets(checks: h.Checks, rows: list[Row], by_wl: dict[str, list[Row]], ref: Any, titles: dict[str, str]) -> None:
    """CartPole x8 for the ratios, every aiocollect row for the first batch."""
    b8, t8 = ref("cartpole8", "bare"), ref("cartpole8", "torchrl")
    aio8 = [r for r in by_wl.get("cartpole8", []) if r.kind == "aio"]
    if b8 is not None:
        for r in aio8:
            x = r.fps / b8.fps
            need = TARGETS["bare_ratio"]
            checks.add(f"CartPole x8: {r.name} >= {need}x bare loop", x >= need, f"{x:.2f}x")
        for r in aio8:
            need = TARGETS["torchrl_ratio"]
            desc = f"CartPole x8: {r.name} >= {need:g}x TorchRL"
            if t8 is None:
                checks.add(desc, None, "TorchRL not run")
            else:
                x = r.fps / t8.fps
                checks.add(desc, x >= need, f"{x:.2f}x")
    limit = TARGETS["first_batch_ms"]
    for r in rows:
        if r.kind == "aio":
            val = f"{r.first_ms:.0f} ms (cold {r.cold_ms:.0f} ms)"
            checks.add(f"{titles[r.group]}: {r.name} first batch < {limit:.0f} ms", r.first_ms < limit, val)


def report(
    table: list[dict[str, Any]],
    resp: dict[str, dict[str, float]],
    st: Settings,
    by_wl: dict[str, list[Row]],
    ref: Any,
    workloads: list[Workload],
) -> None:
    log("\n" + "=" * 100)
    log(
        f"RESULTS: frames/s = median of {st.repeats} timed runs after a warmup; 1st ms = median time to the first batch"
    )
    for line in h.console_table(RESULT_COLUMNS, table):
        log(line)
    log("  spread: (max - min) / median of the timed runs. ep len: frames per episode end seen, a")
    log("  check that the rows of a workload collect alike data (the phantom-frame row counts its")
    log("  extra frames). CPU fr/s: frames per second of process CPU time (all threads); less")
    log("  sensitive to other processes, blind to hand-off waits. Targets use wall-clock frames/s.")

    if any(ref(w.key, "torchrl") for w in workloads):
        log("\naiocollect vs TorchRL (wall-clock frames/s ratio, same workload):")
        for w in workloads:
            trl = ref(w.key, "torchrl")
            if trl is not None:
                aio = [r for r in by_wl[w.key] if r.kind == "aio"]
                parts = [f"{r.name.removeprefix('aiocollect ')} {r.fps / trl.fps:.2f}x" for r in aio]
                log(f"  {w.title:<31} vs {trl.name.removeprefix('TorchRL ')}: " + ", ".join(parts))

    if resp:
        log("\nEvent-loop responsiveness: gap between wakeups of a task doing 'await anyio.sleep(0.001)' in a loop")
        for label, v in resp.items():
            extra = f", collecting at {v['fps']:.0f} frames/s" if math.isfinite(v["fps"]) else ""
            log(h.gap_line(label, v, 22, inside=extra))


def markdown(table: list[dict[str, Any]], resp: dict[str, dict[str, float]], st: Settings, run: h.Session) -> None:
    md = h.markdown_table(MARKDOWN_COLUMNS, table)
    if resp:
        cols = h.gap_columns("event loop while the async Collector runs CartPole-v1 x8")
        md += ["", *h.markdown_table(cols, [{"label": k, **v} for k, v in resp.items()])]
    run.markdown(
        md,
        f", torch.set_num_threads(1), frames_per_batch={FPB}; frames/s is the median of {st.repeats} timed runs "
        "after a warmup; first batch is the time from construction to the first batch in hand",
    )


if __name__ == "__main__":  # the guard matters: subprocess envs re-import this module
    sys.exit(main())
