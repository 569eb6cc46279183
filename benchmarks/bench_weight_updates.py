#!/usr/bin/env python
"""Multi-process collectors while the trainer updates the policy after every batch.

The common training loop, ``for batch in collector: train(batch); collector.update_policy_weights_()``,
measured in ONE run on the same workloads (env + 64-64 MLP policy), each collector with and
without the update after every batch:

* the single-process bare loop (``_workloads.bare_loop``; the reference of "x bare"),
* aiocollect's ``MultiaSyncDataCollector`` and ``MultiSyncDataCollector`` (worker processes), and
  its ``DistributedCollector(sync=False)`` (one local node per worker, ``launcher="mp"``, gloo),
* TorchRL's ``MultiAsyncCollector`` and ``MultiSyncCollector`` (skipped with a note if torchrl is
  missing), updating with their default weight-sync scheme. (TorchRL's distributed collectors are
  left out: ``bench_distributed.py`` compares them.)

"x no update" is a row's frames/s over the same collector's without updates: what updating costs.
"update ms" is the median time of one ``update_policy_weights_()`` call; "lag", aiocollect only (its
frames record their policy version), the median of how many updates old the oldest weights in a
batch were when it arrived.

Workloads: CartPole-v1 as a gymnasium SyncVectorEnv of 8 per worker, 2 workers (all CPU), and a
"waiting" CartPole (``_workloads.WaitingEnv``) whose step waits 0.5 ms without using the CPU,
1 env per worker, ``--waiting-workers`` workers (default 4): an env whose simulator runs
elsewhere, where workers outnumber cores.

Usage::

    python benchmarks/bench_weight_updates.py            # full run (about 4 min on 2 idle cores)
    python benchmarks/bench_weight_updates.py --quick    # smoke run (about 1 min), noisy
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import aiocollect

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _harness as h
import _workloads as wl
from _harness import Col, Row, Run, Settings, log

CARTPOLE_WORKERS, CARTPOLE_ENVS = 2, 8
WAIT_MS = 0.5
TARGETS = {"async_update_cost": 0.85}  # MultiaSync with an update per batch >= this x without
_TRL_NAMES = {
    "MultiSync": ("MultiSyncCollector", "MultiSyncDataCollector"),
    "MultiAsync": ("MultiAsyncCollector", "MultiaSyncDataCollector"),
}
_AIO = {
    "MultiSync": aiocollect.MultiSyncDataCollector,
    "MultiAsync": aiocollect.MultiaSyncDataCollector,
    "Distributed": aiocollect.DistributedDataCollector,
}


@dataclass
class Workload:
    key: str
    title: str
    env_fn: Callable[[], Any]
    trl_env_fn: Callable[[], Any]
    workers: int
    fpb: int  # frames per batch of ONE worker
    policy: nn.Module


def make_workloads(waiting_workers: int) -> list[Workload]:
    torch.manual_seed(0)
    return [
        Workload(
            "cartpole8",
            f"CartPole-v1 x{CARTPOLE_ENVS}/worker, {CARTPOLE_WORKERS} workers",
            functools.partial(wl.make_vec, "CartPole-v1", CARTPOLE_ENVS),
            functools.partial(wl.trl_vec, "CartPole-v1", CARTPOLE_ENVS),
            CARTPOLE_WORKERS,
            800,
            wl.DiscretePolicy(4, 2),
        ),
        Workload(
            "waiting",
            f"Waiting ({WAIT_MS:g} ms/step) x1/worker, {waiting_workers} workers",
            functools.partial(wl.make_waiting, WAIT_MS),
            functools.partial(wl.trl_waiting, WAIT_MS),
            waiting_workers,
            100,
            wl.DiscretePolicy(4, 2),
        ),
    ]


@dataclass
class Samples:
    """What one row records across its runs, besides its frames/s."""

    update_s: list[float] = field(default_factory=list)  # each update_policy_weights_() call
    lag: list[float] = field(default_factory=list)  # aiocollect: how many updates old each batch's oldest weights were


def updating(c: Any, update: bool, samples: Samples) -> Iterator[Any]:
    """Iterate ``c`` (shutting it down at the end); after each batch, update its weights if asked."""
    try:
        for batch in c:
            yield batch
            if update and ("collector", "policy_version") in batch.keys(True):
                samples.lag.append(c.policy_version - int(batch["collector", "policy_version"].min()))
            if update:
                t = time.perf_counter()
                c.update_policy_weights_()
                samples.update_s.append(time.perf_counter() - t)
    finally:
        c.shutdown()


def make_aio(cls: type, role: str, w: Workload, fpb: int, total: int) -> Any:
    if role == "Distributed":  # one node per worker, each an in-process Collector of one env
        return cls([w.env_fn] * w.workers, w.policy, sync=False, frames_per_batch=fpb, total_frames=total,
                   launcher="mp", backend="gloo", collector_class=aiocollect.Collector)  # fmt: skip
    return cls(w.env_fn, w.policy, num_workers=w.workers, frames_per_batch=fpb, total_frames=total)


def fpb_of(role: str, w: Workload) -> int:
    return w.workers * w.fpb if role == "MultiSync" else w.fpb


def build_rows(
    w: Workload, library: str, classes: dict[str, type], samples: dict[tuple[str, str], Samples]
) -> list[Row]:
    rows = []
    for role, cls in classes.items():
        for update in (False, True):
            label = "DistributedCollector(sync=False)" if role == "Distributed" else cls.__name__
            name = f"{library} {label}" + (", update every batch" if update else "")
            fpb = fpb_of(role, w)
            rec = samples.setdefault((w.key, name), Samples())

            def runner(
                total: int,
                cls: type = cls,
                role: str = role,
                fpb: int = fpb,
                update: bool = update,
                rec: Samples = rec,
            ) -> Run:
                if library == "aiocollect":
                    make = functools.partial(make_aio, cls, role, w, fpb, total)
                else:
                    from tensordict.nn import TensorDictModule

                    module = TensorDictModule(w.policy, in_keys=["observation"], out_keys=["action"])
                    make = lambda: cls([w.trl_env_fn] * w.workers, module, frames_per_batch=fpb,  # noqa: E731
                                       total_frames=total)  # fmt: skip
                return h.measure_iter(lambda: updating(make(), update, rec))

            kind = ("upd_" if update else "") + ("aio" if library == "aiocollect" else "torchrl")
            rows.append(Row(w.key, name, kind, runner, fpb, role, w.workers))
    return rows


def check_leaks(row: Row, r: Run) -> None:
    left = h.wait_children_gone()
    if left:
        row.leaks += left
        log(f"  WARNING: {row.name}: {len(left)} child process(es) alive after shutdown: {left}")


RESULT_COLUMNS = [
    Col("workload", "{workload}", 40, left=True),
    Col("row", "{row}", 58, left=True),
    Col("frames/s", "{fps:.0f}", 9),
    Col("x bare", h.ratio("vs_bare"), 7),
    Col("x no update", h.ratio("vs_no_update"), 11),
    Col("x TorchRL", h.ratio("vs_torchrl"), 9),
    Col("update ms", lambda t: h.fmt_ms(t["update_s"]), 9),
    Col("lag", lambda t: h.fmt_n(t["lag"], 1), 5),
]
MARKDOWN_COLUMNS = [
    Col("workload", "{workload}", left=True),
    Col("collector", "{row}", left=True),
    Col("frames/s", "{fps:,.0f}"),
    Col("vs bare loop", h.ratio("vs_bare")),
    Col("vs no update", h.ratio("vs_no_update", "-")),
    Col("vs TorchRL", h.ratio("vs_torchrl", "-")),
    Col("update_policy_weights_ (ms)", lambda t: h.fmt_ms(t["update_s"])),
    Col("lag (updates)", lambda t: h.fmt_n(t["lag"], 1)),
]


def parse_args(argv: list[str] | None) -> Any:
    ap = h.parser(
        __doc__,
        quick="short smoke run (about 1 min), noisy",
        repeats="timed runs per row (default 3; 1 with --quick)",
        target_seconds="approximate steady-state length of one timed run (default 1.0; 0.3 with --quick)",
        no_torchrl="skip the TorchRL rows",
    )
    ap.add_argument("--workload", action="append", choices=["cartpole8", "waiting"], help="only this workload")
    ap.add_argument("--waiting-workers", type=int, default=4, help="workers of the waiting workload (default 4)")
    ap.add_argument(
        "--torchrl-start-method",
        choices=["spawn", "fork", "forkserver"],
        default="spawn",
        help="multiprocessing start method for the TorchRL rows (default spawn, what `import torchrl` selects)",
    )
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    st = Settings.of_args(args)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    trl_missing = h.torchrl_note(args.no_torchrl)
    run = h.Session("torch", "tensordict", "gymnasium", "torchrl", aiocollect=aiocollect.__version__)
    if trl_missing is not None:
        run.versions["torchrl"] = "not used"
    run.header(
        f"bench_weight_updates: {'QUICK' if quick else 'full'} run, {st.repeats} timed runs/row",
        "torch threads=1",
        *([f"NOTE: TorchRL rows skipped ({trl_missing})"] if trl_missing else []),
    )
    workloads = [w for w in make_workloads(args.waiting_workers) if not args.workload or w.key in args.workload]
    samples: dict[tuple[str, str], Samples] = {}
    rows: list[Row] = []
    log("\n[1/2] bare loop and aiocollect (round robin per workload)")
    for w in workloads:

        def bare_run(t: int, w: Workload = w) -> Run:
            return h.measure_iter(lambda: wl.bare_loop(w.env_fn, w.policy, w.fpb, t))

        bare = Row(w.key, "bare loop (1 process)", "bare", bare_run, w.fpb)
        wrows = [bare, *build_rows(w, "aiocollect", _AIO, samples)]
        h.run_rows(wrows, st, check_leaks)
        rows += wrows
    if trl_missing is None:
        h.torchrl_note(False, import_it=True)
        import torchrl.collectors as trc

        classes = {role: h.first_attr(trc, names)[0] for role, names in _TRL_NAMES.items()}
        if quick:
            classes = {"MultiAsync": classes["MultiAsync"]}
        multiprocessing.set_start_method(args.torchrl_start_method, force=True)
        log(f"\n[2/2] TorchRL ({', '.join(c.__name__ for c in classes.values())}), {args.torchrl_start_method}")
        for w in workloads:
            trows = build_rows(w, "TorchRL", classes, samples)
            h.run_rows(trows, st, check_leaks)
            rows += trows
    else:
        log(f"\n[2/2] TorchRL rows skipped ({trl_missing})")

    table = []
    for w in workloads:
        mine = [r for r in rows if r.group == w.key]
        bare = h.find(mine, kind="bare")
        for r in mine:
            library = "torchrl" if r.kind.endswith("torchrl") else "aio"
            plain = h.find(mine, kind=library, role=r.role) if r.kind.startswith("upd_") else None
            other = None
            if library == "aio" and r.role:
                other = h.find(mine, kind=r.kind.replace("aio", "torchrl"), role=r.role)
            rec = samples.get((w.key, r.name), Samples())
            table.append(
                {
                    "workload": w.title,
                    "row": r.name,
                    "kind": r.kind,
                    "role": r.role,
                    "fps": r.fps,
                    "vs_bare": h.div(r.fps, bare and bare.fps),
                    "vs_no_update": h.div(r.fps, plain and plain.fps),
                    "vs_torchrl": h.div(r.fps, other and other.fps),
                    "update_s": h.median(rec.update_s),
                    "lag": h.median(rec.lag),
                    "leaked": r.leaks,
                }
            )
    checks = h.Checks()
    need = TARGETS["async_update_cost"]
    for t in table:
        if t["kind"] == "upd_aio" and t["role"] in ("MultiAsync", "Distributed"):
            label = "MultiaSyncDataCollector" if t["role"] == "MultiAsync" else "DistributedCollector(sync=False)"
            desc = f"{t['workload']}: {label} updating every batch >= {need:g}x without updates"
            checks.add(desc, t["vs_no_update"] >= need, h.fmt_x(t["vs_no_update"]))
    leaked = [t["row"] for t in table if t["leaked"]]
    checks.add("no worker process left alive after shutdown", not leaked, ", ".join(leaked) or "none")

    log("\n" + "=" * 120)
    log(f"RESULTS: frames/s = median of {st.repeats} timed runs (steady state, first batch excluded)")
    for line in h.console_table(RESULT_COLUMNS, table):
        log(line)
    checks.report()
    run.markdown(h.markdown_table(MARKDOWN_COLUMNS, table), f"; frames/s is the median of {st.repeats} timed runs")
    run.footer()
    run.write_json(args.json, settings={"quick": quick, "waiting_workers": args.waiting_workers}, rows=table,
                   checks=checks.as_json())  # fmt: skip
    return checks.exit_code(args.strict)


if __name__ == "__main__":  # the guard matters: spawned workers re-import this module
    sys.exit(main())
