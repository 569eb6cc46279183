#!/usr/bin/env python
"""Distributed collectors side by side: first batch, throughput, shutdown, trainer CPU.

Compares, in ONE run and on the same workloads (env + 64-64 MLP policy, 2 collection nodes
started as local processes, ``launcher="mp"``, ``backend="gloo"``, one env per node):

* aiocollect's ``DistributedCollector(sync=True)``, ``DistributedCollector(sync=False)`` and
  ``DistributedSyncCollector`` (their blocking twins in a plain ``for`` loop), with
  ``collector_class=Collector``;
* TorchRL's ``DistributedCollector`` (``sync=True`` and ``sync=False``) and
  ``DistributedSyncCollector`` (``torchrl.collectors.distributed``; the ``...DataCollector``
  names on older TorchRL), each run with its own free ``tcp_port``;
* a bare hand-written loop (``_workloads.bare_loop``: one env, the same policy, one
  process), the reference for throughput (ratio 1.00).

Workloads: CartPole-v1, and the "heavy" CartPole-like env (``_workloads.HeavyEnv``) whose step
burns about 1 ms of pure-Python CPU. Every configuration runs in a fresh Python process
(``python -c``, its own process group, killed on timeout) that prints one JSON line: the time
from the constructor call to the first batch (compared with the wall time of
``python -c "import torch, gymnasium"`` measured in the same run: no node can start faster),
steady-state frames/s over N batches after a warmup, the time from ``break`` to the
collector's shutdown returning and to every node process being gone, and the trainer
process's CPU use while it waits for batches. A configuration that fails or hangs is
recorded with its error and the run goes on. The output ends with a table, the
aiocollect/TorchRL and aiocollect/bare ratios, and a Markdown table.

Usage::

    python benchmarks/bench_distributed.py            # full run (about 9 min on 2 idle cores)
    python benchmarks/bench_distributed.py --quick    # CI smoke (about 1.5 min on 2 idle cores)

See benchmarks/README.md for what each row means and the fairness rules.

Everything a node process needs (the policy class, the env factories) is defined at module
level in ``_workloads``, and this module imports only the standard library, numpy, torch and
gymnasium at the top: nodes re-import it to unpickle those, and must not pay for anything else.
"""

from __future__ import annotations

import functools
import math
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
import _workloads as wl
from _harness import Col, log

NUM_NODES = 2
HEAVY_WORK = wl.HEAVY_WORK
REFERENCE_CMD = "import torch, gymnasium"
# For information: a node that runs a collector also needs tensordict (TensorDict batches).
TD_REFERENCE_CMD = "import torch, gymnasium, tensordict"

WORKLOADS: dict[str, dict[str, Any]] = {
    # node_fpb: frames one node collects per batch; frames: timed frames of a run (full, quick)
    "cartpole": {
        "title": "CartPole-v1 x1/node",
        "node_fpb": 200,
        "frames": (16_000, 6_000),
    },
    "heavy": {
        "title": "Heavy (~1 ms/step) x1/node",
        "node_fpb": 100,
        "frames": (3_000, 1_200),
    },
}


def env_factories(workload: str, work: int) -> tuple[Any, Any]:
    """(aiocollect's and the bare loop's env factory, TorchRL's) for ``workload``."""
    if workload == "cartpole":
        return functools.partial(wl.make_env, "CartPole-v1"), functools.partial(wl.trl_env, "CartPole-v1")
    return functools.partial(wl.make_heavy, work), functools.partial(wl.trl_heavy, work)


# Configurations: (key, library, role, label). The role pairs aiocollect with TorchRL.
CONFIGS: list[tuple[str, str, str | None, str]] = [
    ("bare", "bare", None, "bare loop (1 process, 1 env)"),
    ("aio-sync", "aiocollect", "sync", "aiocollect DistributedCollector(sync=True)"),
    ("aio-async", "aiocollect", "async", "aiocollect DistributedCollector(sync=False)"),
    ("aio-free", "aiocollect", "free", "aiocollect DistributedSyncCollector"),
    ("trl-sync", "torchrl", "sync", "TorchRL DistributedCollector(sync=True)"),
    ("trl-async", "torchrl", "async", "TorchRL DistributedCollector(sync=False)"),
    ("trl-free", "torchrl", "free", "TorchRL DistributedSyncCollector"),
]
CONFIG_KEYS = [c[0] for c in CONFIGS]
QUICK_CONFIGS = {  # --quick: TorchRL's start and shutdown cost ~10 s a run; keep one of them
    "cartpole": ["bare", "aio-sync", "aio-async", "aio-free", "trl-sync"],
    "heavy": ["bare", "aio-sync", "aio-async", "aio-free"],
}
_TRL_NAMES = {  # 0.14 names first, then the legacy ones
    "sync": ("DistributedCollector", "DistributedDataCollector"),
    "async": ("DistributedCollector", "DistributedDataCollector"),
    "free": ("DistributedSyncCollector", "DistributedSyncDataCollector"),
}


def frames_per_batch(role: str | None, node_fpb: int) -> int:
    """What the caller receives per batch: every node's share where they are gathered."""
    return node_fpb if role in (None, "async") else NUM_NODES * node_fpb


# --------------------------------------------------------------------------------------------
# The child process: one configuration, one fresh interpreter.
# --------------------------------------------------------------------------------------------


def _alive(psutil: Any, p: Any) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def _cpu_s(psutil: Any, procs: list[Any]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system  # the process itself, not its children
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            pass
    return total


def _make_collector(cfg: dict[str, Any], policy: nn.Module) -> tuple[Any, Any]:
    """(an iterable of batches, its shutdown function or None) for the configuration."""
    aio_env, trl_env = env_factories(cfg["workload"], cfg["heavy_work"])
    fpb, total, lib, role = cfg["fpb"], cfg["total_frames"], cfg["lib"], cfg["role"]
    envs = [aio_env] * NUM_NODES
    if lib == "bare":
        return wl.bare_loop(aio_env, policy, fpb, total), None
    if lib == "aiocollect":
        import aiocollect
        import aiocollect.blocking as ab

        common = {
            "frames_per_batch": fpb, "total_frames": total, "launcher": "mp",
            "collector_class": aiocollect.Collector, "backend": "gloo",
        }  # fmt: skip
        if role == "free":
            c = ab.DistributedSyncCollector(envs, policy, **common)
        else:
            c = ab.DistributedCollector(envs, policy, sync=role == "sync", **common)
        return c, c.shutdown
    import logging

    import torchrl.collectors.distributed as trd
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector as TrlCollector

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    cls, _ = h.first_attr(trd, _TRL_NAMES[role])
    module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
    common = {
        "frames_per_batch": fpb, "total_frames": total, "launcher": "mp",
        "collector_class": TrlCollector, "backend": "gloo", "tcp_port": cfg["tcp_port"],
    }  # fmt: skip
    envs = [trl_env] * NUM_NODES
    if role == "free":
        c = cls(envs, module, **common)
    else:
        c = cls(envs, module, sync=role == "sync", **common)
    return c, c.shutdown


def child_main(
    cfg: dict[str, Any],
    t_start: float,
    make: Callable[..., Any] | None = None,
    find_nodes: Callable[[], list[Any]] | None = None,
) -> dict[str, Any]:
    """One configuration in this process. ``make(cfg, policy)`` builds the collector (default:
    this module's distributed rows) and ``find_nodes()`` lists its node processes (default:
    this process's descendants but its helpers); bench_ray_rpc.py passes its own."""
    import warnings

    import psutil

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    policy = wl.seeded(wl.DiscretePolicy, 4, 2)
    me = psutil.Process()
    warm, n = cfg["warm_batches"], cfg["batches"]
    out: dict[str, Any] = {"pid": os.getpid()}

    t_lib = time.perf_counter()
    if cfg["lib"] == "aiocollect":
        import aiocollect.blocking  # noqa: F401 - the import is not part of the first batch
    elif cfg["lib"] == "torchrl":
        import torchrl.collectors.distributed  # noqa: F401
    out["import_s"] = time.perf_counter() - t_start  # python start to here: torch, gym, lib
    out["lib_import_s"] = time.perf_counter() - t_lib

    stamps: list[float] = []
    frames: list[int] = []
    dones = 0
    nodes: list[Any] = []
    cpu0 = cpu1 = nodes_cpu0 = nodes_cpu1 = 0.0
    shutdown = None
    t0 = time.perf_counter()
    try:
        it, shutdown = (make or _make_collector)(cfg, policy)
        for i, batch in enumerate(it):
            stamps.append(time.perf_counter())
            frames.append(h.batch_frames(batch))
            dones += h.batch_dones(batch)
            if i == warm - 1:  # the steady window starts with the last warmup batch in hand
                nodes = (find_nodes or default_nodes)() if cfg["lib"] != "bare" else []
                cpu0, nodes_cpu0 = _cpu_s(psutil, [me]), _cpu_s(psutil, nodes)
            if i == warm + n - 1:
                cpu1, nodes_cpu1 = _cpu_s(psutil, [me]), _cpu_s(psutil, nodes)
                break
    except BaseException as exc:
        import traceback

        out["error"] = f"{type(exc).__name__}: {exc}"
        out["traceback"] = traceback.format_exc()[-3000:]
    t_break = time.perf_counter()
    if shutdown is not None:
        try:
            shutdown()
        except BaseException as exc:
            out.setdefault("error", f"shutdown: {type(exc).__name__}: {exc}")
    t_closed = time.perf_counter()
    # Every node process recorded in the steady window must be gone (a zombie counts as
    # gone: it has exited and only waits for its parent to read its status).
    deadline = t_closed + cfg["gone_timeout"]
    left = [p for p in nodes if _alive(psutil, p)]
    while left and time.perf_counter() < deadline:
        time.sleep(0.005)
        left = [p for p in left if _alive(psutil, p)]
    t_gone = time.perf_counter()
    if left:
        out["left_alive"] = [p.pid for p in left]
        for p in left:  # so that this process can exit; the parent reports the leak
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass

    out["batches"] = len(stamps)
    out["frames"] = sum(frames)
    out["dones"] = dones
    out["node_pids"] = [p.pid for p in nodes]
    if stamps:
        out["first_s"] = stamps[0] - t0
    if len(stamps) == warm + n:
        wall = stamps[-1] - stamps[warm - 1]
        out["steady_s"] = wall
        out["fps"] = sum(frames[warm:]) / wall
        out["trainer_cpu"] = (cpu1 - cpu0) / wall
        out["trainer_ms_per_batch"] = (cpu1 - cpu0) / n * 1e3
        out["nodes_cpu"] = (nodes_cpu1 - nodes_cpu0) / wall if nodes else None
        out["batch_ms_p50"] = h.median((b - a) * 1e3 for a, b in zip(stamps[warm - 1 :], stamps[warm:], strict=False))
    elif "error" not in out:
        out["error"] = f"the collector stopped after {len(stamps)} of {warm + n} batches"
    out["close_s"] = t_closed - t_break  # break -> shutdown returned
    out["gone_s"] = None if left else t_gone - t_break  # break -> every node process gone
    return out


def default_nodes() -> list[Any]:
    """This process's descendants but its helpers (resource tracker, fork server)."""
    return h.child_processes()[0]


def _child_entry(cfg_json: str, t_start: float) -> None:
    """``python -c`` entry point of a child (see `_harness.run_child`)."""
    h.child_entry(child_main, cfg_json, t_start)


# --------------------------------------------------------------------------------------------
# Summaries and formatting
# --------------------------------------------------------------------------------------------


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in runs if "error" not in r]
    fps = [r["fps"] for r in ok]
    frames = sum(r["frames"] for r in ok)
    dones = sum(r["dones"] for r in ok)
    return {
        "runs": len(runs),
        "ok": len(ok),
        "errors": [r["error"] for r in runs if "error" in r],
        "fps": h.median(fps),
        "spread": h.spread(fps),
        **h.medians(ok, ("first_s", "close_s", "gone_s", "trainer_cpu", "trainer_ms_per_batch", "nodes_cpu")),
        "batch_ms": h.median([r.get("batch_ms_p50") for r in ok]),
        "import_s": h.median([r.get("import_s") for r in ok]),
        "ep_len": frames / dones if dones else math.inf,
        "leaks": [
            (r.get("left_alive") or []) + (r.get("group_left_alive") or [])
            for r in runs
            if r.get("left_alive") or r.get("group_left_alive")
        ],
        "exit_notes": [r["exit_note"] for r in runs if "exit_note" in r],
    }


# --------------------------------------------------------------------------------------------
# Main and the output tables (their columns: a heading and how a result record becomes the cell)
# --------------------------------------------------------------------------------------------


def _n(key: str, digits: int = 0, scale: float = 1.0, sep: bool = False) -> Any:
    return lambda t: h.fmt_n(t[key] * scale, digits, sep)


def _pct(key: str) -> Any:
    return lambda t: h.fmt_pct(t[key])


def _not_bare(cell: Any) -> Any:
    """The cell, or "-" on the bare loop's row, which starts nothing and shuts nothing down."""
    return lambda t: "-" if t["lib"] == "bare" else cell(t)


def _ep_len(t: dict[str, Any]) -> str:
    failed = f"  ({t['runs'] - t['ok']} of {t['runs']} runs failed)" if t["errors"] else ""
    return f"{t['ep_len']:.1f}{failed}"


RESULT_COLUMNS = [
    Col("workload", "{workload}", 27, left=True),
    Col("row", "{row}", 44, left=True),
    Col("fpb", "{fpb}", 4),
    Col("frames/s", _n("fps"), 9),
    Col("x bare", h.ratio("vs_bare"), 7),
    Col("x TorchRL", h.ratio("vs_torchrl"), 9),
    Col("1st s", _n("first_s", 2), 6),
    Col("/floor", h.ratio("first_vs_import"), 7),
    Col("close ms", _n("close_s", scale=1e3), 8),
    Col("gone ms", _n("gone_s", scale=1e3), 8),
    Col("trainer", _pct("trainer_cpu"), 7),
    Col("ms/b", _n("trainer_ms_per_batch", 1), 5),
    Col("nodes", _pct("nodes_cpu"), 6),
    Col("spread", lambda t: f"{t['spread'] * 100:.0f}%", 6),
    Col("ep len", _ep_len, 6),
]
MARKDOWN_COLUMNS = [
    Col("workload", "{workload}", left=True),
    Col("collector", "{row}", left=True),
    Col("fpb", "{fpb}"),
    Col("frames/s", _n("fps", sep=True)),
    Col("vs bare loop", h.ratio("vs_bare")),
    Col("vs TorchRL", h.ratio("vs_torchrl", "-")),
    Col("first batch (s)", _n("first_s", 2)),
    Col("/ import floor", _not_bare(h.ratio("first_vs_import"))),
    Col("close (ms)", _not_bare(_n("close_s", scale=1e3, sep=True))),
    Col("nodes gone (ms)", _not_bare(_n("gone_s", scale=1e3, sep=True))),
    Col("trainer CPU", _pct("trainer_cpu")),
    Col("trainer CPU per batch (ms)", _n("trainer_ms_per_batch", 1)),
    Col("nodes CPU", _not_bare(_pct("nodes_cpu"))),
]


def parse_args(argv: list[str] | None) -> Any:
    ap = h.parser(
        __doc__,
        quick="short CI smoke run (about 1.5 min)",
        repeats="fresh processes per configuration (default 3; 1 with --quick); the median is reported",
        no_torchrl="skip the TorchRL configurations",
        strict=False,
    )
    ap.add_argument("--workload", action="append", choices=list(WORKLOADS), help="run only this workload (repeatable)")
    ap.add_argument(
        "--config",
        action="append",
        choices=CONFIG_KEYS,
        help="run only this configuration (repeatable; default: all, or a subset with --quick)",
    )
    ap.add_argument(
        "--frames-scale", type=float, default=1.0, help="multiply the timed frames of every run by this (default 1)"
    )
    ap.add_argument(
        "--warmup", type=int, default=None, help="batches before the steady window (default 3; 2 with --quick)"
    )
    ap.add_argument(
        "--heavy-work",
        type=int,
        default=HEAVY_WORK,
        help=f"iterations of pure-Python work per heavy step (default {HEAVY_WORK}, ~1 ms)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="seconds a configuration's process may take to report before it and its nodes are killed (default 180)",
    )
    ap.add_argument(
        "--gone-timeout",
        type=float,
        default=30.0,
        help="seconds to wait after shutdown for the node processes to be gone (default 30)",
    )
    return ap.parse_args(argv)


def log_run(w: str, label: str, r: dict[str, Any], port: str) -> None:
    if "error" in r:
        log(f"    {w:<8} {label:<44} ERROR{port}: {r['error']}")
        for t in (r.get("traceback") or r.get("stderr") or "").strip().splitlines()[-8:]:
            log(f"      {t}")
        return
    gone = "n/a" if r.get("gone_s") is None else f"{r['gone_s'] * 1e3:.0f}"
    log(
        f"    {w:<8} {label:<44} {r['fps']:7.0f} frames/s  first {r['first_s']:5.2f} s  close "
        f"{r['close_s'] * 1e3:5.0f} ms  gone {gone} ms  trainer CPU {r['trainer_cpu'] * 100:3.0f}%  "
        f"(process {r['wall_s']:.1f} s){port}"
    )
    for what in ("left_alive", "group_left_alive", "exit_note"):
        if r.get(what):
            log(f"      WARNING: {what}: {r[what]}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    repeats = args.repeats or (1 if quick else 3)
    warm = args.warmup or (2 if quick else 3)

    import aiocollect  # lazy: this imports neither tensordict nor the collectors

    trl_note = h.torchrl_note(args.no_torchrl)
    run = h.Session("torch", "tensordict", "gymnasium", "torchrl", aiocollect=aiocollect.__version__)
    if trl_note is not None:
        run.versions["torchrl"] = "not used"
    workloads = [w for w in WORKLOADS if not args.workload or w in args.workload]
    plan: dict[str, list[str]] = {}
    for w in workloads:
        keys = args.config or (QUICK_CONFIGS[w] if quick else CONFIG_KEYS)
        plan[w] = [k for k in keys if not (trl_note and k.startswith("trl"))]
    labels = {k: (lib, role, label) for k, lib, role, label in CONFIGS}
    burn_ms, burn_min = wl.heavy_step_ms(args.heavy_work)
    run.header(
        f"bench_distributed: {'QUICK' if quick else 'full'} run, {repeats} fresh process(es) "
        f"per configuration, {NUM_NODES} nodes (launcher='mp', backend='gloo', one env per node)",
        sys.executable,
        f"aiocollect from {os.path.dirname(aiocollect.__file__)}",
        *([f"NOTE: TorchRL configurations skipped ({trl_note})"] if trl_note else []),
        f"heavy env: {args.heavy_work} work iterations per step = {burn_ms:.2f} ms of CPU here "
        f"(median; fastest {burn_min:.2f} ms)",
    )

    used_ports: set[int] = set()
    ref_runs: list[float] = []
    td_ref_runs: list[float] = []

    def reference(rep: int) -> None:
        ref_runs.append(h.time_command(REFERENCE_CMD, args.timeout))
        td_ref_runs.append(h.time_command(TD_REFERENCE_CMD, args.timeout))
        log(
            f'  round {rep + 1}: `python -c "{REFERENCE_CMD}"` {ref_runs[-1]:.2f} s '
            f"(with tensordict {td_ref_runs[-1]:.2f} s)"
        )

    def config(wk: tuple[str, str], _rep: int) -> dict[str, Any]:
        (w, key), spec = wk, WORKLOADS[wk[0]]
        lib, role, _ = labels[key]
        fpb = frames_per_batch(role, spec["node_fpb"])
        batches = max(2, math.ceil(spec["frames"][1 if quick else 0] * args.frames_scale / fpb))
        return {
            "workload": w,
            "key": key,
            "lib": lib,
            "role": role,
            "fpb": fpb,
            "warm_batches": warm,
            "batches": batches,
            "total_frames": (warm + batches) * fpb,
            "heavy_work": args.heavy_work,
            "gone_timeout": args.gone_timeout,
            # TorchRL 0.14.1 uses tcp_port (init_process_group's rendezvous), tcp_port + 1
            # (its TCPStore) and tcp_port + 2 (the weight sync scheme's TCPStore).
            "tcp_port": h.free_port_block(used_ports, 3) if lib == "torchrl" else None,
        }

    def logged(wk: tuple[str, str], _rep: int, cfg: dict[str, Any], r: dict[str, Any]) -> None:
        r["tcp_port"] = cfg["tcp_port"]
        log_run(wk[0], labels[wk[1]][2], r, f" (tcp_port {cfg['tcp_port']})" if cfg["tcp_port"] else "")

    log("\nfresh processes, round robin (the import reference, then every configuration)")
    keys = [(w, k) for w in workloads for k in plan[w]]
    results = h.fresh_rounds(
        "bench_distributed",
        keys,
        repeats,
        config,
        args.timeout,
        rounds=max(repeats, 3),
        before_round=reference,
        on_result=logged,
    )

    ref, td_ref = h.median(ref_runs), h.median(td_ref_runs)
    summ = {wk: summarize(runs) for wk, runs in results.items()}
    table: list[dict[str, Any]] = []
    for w in workloads:
        bare = summ.get((w, "bare"))
        for key in plan[w]:
            lib, role, label = labels[key]
            s = summ[(w, key)]
            trl = summ.get((w, "trl-" + role)) if lib == "aiocollect" and role else None
            table.append(
                {
                    "workload": WORKLOADS[w]["title"],
                    "workload_key": w,
                    "config": key,
                    "row": label,
                    "lib": lib,
                    "role": role,
                    "fpb": frames_per_batch(role, WORKLOADS[w]["node_fpb"]),
                    **s,
                    "vs_bare": h.div(s["fps"], bare and bare["fps"]),
                    "vs_torchrl": h.div(s["fps"], trl and trl["fps"]),
                    "first_vs_torchrl": h.div(s["first_s"], trl and trl["first_s"]),
                    "gone_vs_torchrl": h.div(s["gone_s"], trl and trl["gone_s"]),
                    "first_vs_import": h.div(s["first_s"], ref),
                    "runs_detail": results[(w, key)],
                }
            )
    report(table, repeats, ref, td_ref, len(ref_runs))
    markdown(table, run, repeats, ref, td_ref, burn_ms)
    run.footer()
    settings = {
        "quick": quick,
        "repeats": repeats,
        "warmup_batches": warm,
        "num_nodes": NUM_NODES,
        "heavy_work": args.heavy_work,
        "heavy_step_ms": burn_ms,
        "workloads": {w: WORKLOADS[w] for w in workloads},
        "plan": plan,
    }
    run.write_json(
        args.json,
        settings=settings,
        reference_cmd=REFERENCE_CMD,
        reference_s=ref,
        reference_runs_s=ref_runs,
        td_reference_cmd=TD_REFERENCE_CMD,
        td_reference_s=td_ref,
        td_reference_runs_s=td_ref_runs,
        rows=table,
    )
    return 0


def report(table: list[dict[str, Any]], repeats: int, ref: float, td_ref: float, n_ref: int) -> None:
    log("\n" + "=" * 150)
    log(
        f"RESULTS: medians of {repeats} fresh process(es) per row; floor = `python -c "
        f'"{REFERENCE_CMD}"` = {ref:.2f} s (median of {n_ref}; `{TD_REFERENCE_CMD}` {td_ref:.2f} s)'
    )
    rows = [t if t["ok"] else [t["workload"], t["row"], f"FAILED: {'; '.join(t['errors'])[:200]}"] for t in table]
    for line in h.console_table(RESULT_COLUMNS, rows):
        log(line)
    log("  fpb: frames per batch as the caller receives it. x bare / x TorchRL: frames/s over the")
    log("  bare loop's / TorchRL's class of the same role. 1st s: constructor call -> first batch;")
    log("  /floor: that over the fresh-process `import torch, gymnasium`. close ms: break ->")
    log("  shutdown() returned; gone ms: break -> every node process gone. trainer / nodes: CPU")
    log("  time of the trainer process / of both node processes over the steady window, per wall")
    log("  second (100% = one core); ms/b: the trainer's CPU milliseconds per batch. ep len:")
    log("  frames per episode end (rows collect alike).")

    log("\nRatios aiocollect / TorchRL (same role; frames/s above 1 is faster, times below 1 is")
    log("faster) and aiocollect / bare loop:")
    for t in table:
        if t["lib"] == "aiocollect":
            log(
                f"  {t['workload']:<27} {t['row']:<44} frames/s {h.fmt_x(t['vs_torchrl']):>7} TorchRL, "
                f"{h.fmt_x(t['vs_bare']):>6} bare; first batch {h.fmt_x(t['first_vs_torchrl']):>6}; "
                f"nodes gone {h.fmt_x(t['gone_vs_torchrl']):>6}"
            )
    problems = [t for t in table if t["errors"] or t["leaks"] or t["exit_notes"]]
    if problems:
        log("\nFailures, leaks and hangs:")
        for t in problems:
            for e in t["errors"]:
                log(f"  {t['workload']}: {t['row']}: {e}")
            for leak in t["leaks"]:
                log(f"  {t['workload']}: {t['row']}: processes alive after shutdown: {leak}")
            for note in t["exit_notes"]:
                log(f"  {t['workload']}: {t['row']}: {note}")


def markdown(
    table: list[dict[str, Any]], run: h.Session, repeats: int, ref: float, td_ref: float, burn_ms: float
) -> None:
    rows = []
    for t in table:
        err = "; ".join(sorted(set(t["errors"])))[:160].replace("|", "/")
        rows.append(t if t["ok"] else [t["workload"], t["row"], str(t["fpb"]), f"failed: {err}"])
    run.markdown(
        h.markdown_table(MARKDOWN_COLUMNS, rows),
        f"; {NUM_NODES} nodes, launcher='mp', backend='gloo'; heavy step {burn_ms:.2f} ms; median of {repeats} "
        f'fresh process(es) per row; import floor `python -c "{REFERENCE_CMD}"` = {ref:.2f} s '
        f"(`{TD_REFERENCE_CMD}`: {td_ref:.2f} s)",
    )


if __name__ == "__main__":  # the guard matters: node processes re-import this module
    sys.exit(main())
