#!/usr/bin/env python
"""RPC and Ray collectors side by side: first batch, throughput, shutdown, trainer CPU.

Compares, in ONE run and on the workloads of ``bench_distributed.py`` (CartPole-v1 and the
~1 ms CPU-heavy env, its 64-64 MLP policy, 2 collection nodes, one env per node,
``collector_class`` = the single-env collector in both libraries):

* aiocollect's ``RPCCollector`` (``launcher="mp"``) and ``RayCollector``, ``sync=True`` and
  ``sync=False`` (their blocking twins in a plain ``for`` loop);
* TorchRL's ``RPCCollector`` (``launcher="mp"``) and ``RayCollector``, the same modes;
* the single-process bare loop (throughput reference, ratio 1.00).

Every configuration runs in a fresh Python process (``_harness.run_child``). For
the Ray rows that process starts a local Ray first (``num_cpus=2``, on 127.0.0.1; both
libraries join it and leave it running), so "first batch" is measured after the engine is up
and ``ray.init`` is its own column, as is ``ray.shutdown`` after the collector closed. Actors
get ``{"num_cpus": 1}`` in both libraries. The first batch is compared with
``python -c "import torch, gymnasium"`` measured in the same run.

Usage::

    python benchmarks/bench_ray_rpc.py            # full run (3 fresh processes per row)
    python benchmarks/bench_ray_rpc.py --quick    # smoke run (1 process per row, fewer frames)

See benchmarks/README.md for what each row means.
"""

from __future__ import annotations

import math
import os
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)  # the sibling modules, from any cwd
# Loopback only, and before anything imports ray: Ray otherwise uses the default route's address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

import _harness as h  # noqa: E402 - after the environment above
import bench_distributed as bd  # noqa: E402
from _harness import Col, log  # noqa: E402

NODE = {"num_cpus": 1}
# (key, library, engine, sync, label)
CONFIGS: list[tuple[str, str, str | None, bool, str]] = [
    ("bare", "bare", None, False, "bare loop (1 process, 1 env)"),
    ("aio-rpc-sync", "aiocollect", "rpc", True, "aiocollect RPCCollector(sync=True)"),
    ("aio-rpc-async", "aiocollect", "rpc", False, "aiocollect RPCCollector(sync=False)"),
    ("trl-rpc-sync", "torchrl", "rpc", True, "TorchRL RPCCollector(sync=True)"),
    ("trl-rpc-async", "torchrl", "rpc", False, "TorchRL RPCCollector(sync=False)"),
    ("aio-ray-sync", "aiocollect", "ray", True, "aiocollect RayCollector(sync=True)"),
    ("aio-ray-async", "aiocollect", "ray", False, "aiocollect RayCollector(sync=False)"),
    ("trl-ray-sync", "torchrl", "ray", True, "TorchRL RayCollector(sync=True)"),
    ("trl-ray-async", "torchrl", "ray", False, "TorchRL RayCollector(sync=False)"),
]


def _make(cfg: dict[str, Any], policy: Any) -> tuple[Any, Any]:
    if cfg["lib"] == "bare":
        return bd._make_collector(cfg, policy)
    aio_env, trl_env = bd.env_factories(cfg["workload"], cfg["heavy_work"])
    common = {"frames_per_batch": cfg["fpb"], "total_frames": cfg["total_frames"], "sync": cfg["sync"]}
    if cfg["engine"] == "rpc":
        common.update(launcher="mp")
    else:
        common.update(remote_configs=NODE)
    if cfg["lib"] == "aiocollect":
        import aiocollect
        import aiocollect.blocking as ab

        cls = ab.RPCCollector if cfg["engine"] == "rpc" else ab.RayCollector
        c = cls([aio_env] * bd.NUM_NODES, policy, collector_class=aiocollect.Collector, **common)
        return c, c.shutdown
    import logging

    import torchrl.collectors.distributed as trd
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector as TrlCollector

    logging.getLogger("torchrl").setLevel(logging.WARNING)
    module = TensorDictModule(policy, in_keys=["observation"], out_keys=["action"])
    if cfg["engine"] == "rpc":
        common.update(tcp_port=str(cfg["tcp_port"]))
    cls = trd.RPCCollector if cfg["engine"] == "rpc" else trd.RayCollector
    c = cls([trl_env] * bd.NUM_NODES, module, collector_class=TrlCollector, **common)
    return c, c.shutdown


_RAY_OWN = {"ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent"}


def _ray_nodes() -> list[Any]:
    """Ray actor processes (``ray::<Class>``), not Ray's own processes or idle workers."""
    import psutil

    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if cmd.startswith("ray::") and cmd.split()[0] not in _RAY_OWN:
            out.append(p)
    return out


def child_main(cfg: dict[str, Any], t_start: float) -> dict[str, Any]:
    """One configuration in this process; a Ray row starts a local Ray first and stops it last."""
    if cfg["engine"] != "ray":
        return bd.child_main(cfg, t_start, make=_make)
    import ray

    t = time.perf_counter()
    path = os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])
    ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})  # fmt: skip
    extra = {"engine_s": time.perf_counter() - t}
    try:
        res = bd.child_main(cfg, t_start, make=_make, find_nodes=_ray_nodes)
    finally:
        t = time.perf_counter()
        ray.shutdown()
        extra["engine_close_s"] = time.perf_counter() - t
    return {**res, **extra}


def _child_entry(cfg_json: str, t_start: float) -> None:
    """``python -c`` entry point of one configuration (see `_harness.run_child`)."""
    h.child_entry(child_main, cfg_json, t_start)


def _ms(x: float) -> str:
    return h.fmt_n(x * 1e3, sep=True) if math.isfinite(x) else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(
        __doc__,
        quick="smoke run: 1 process per row, fewer frames",
        repeats="fresh processes per row (default 3, 1 with --quick)",
        strict=False,
    )
    ap.add_argument("--workload", action="append", choices=list(bd.WORKLOADS), help="only this workload")
    ap.add_argument("--config", action="append", choices=[c[0] for c in CONFIGS], help="only this row")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per configuration before it is killed")
    args = ap.parse_args(argv)
    repeats, warm = args.repeats or (1 if args.quick else 3), 2 if args.quick else 3
    workloads = args.workload or list(bd.WORKLOADS)
    keys = args.config or [c[0] for c in CONFIGS]
    rows = {c[0]: c for c in CONFIGS}
    run = h.Session("torch", "gymnasium", "ray", "torchrl", "aiocollect")
    run.header(f"bench_ray_rpc: {repeats} fresh process(es) per row, {bd.NUM_NODES} nodes", sys.executable)
    floor: list[float] = []
    used_ports: set[int] = set()

    def reference(rep: int) -> None:
        floor.append(h.time_command(bd.REFERENCE_CMD, args.timeout))
        log(f"round {rep + 1}: import floor {floor[-1]:.2f} s")

    def config(wk: tuple[str, str], _rep: int) -> dict[str, Any]:
        (w, key), spec = wk, bd.WORKLOADS[wk[0]]
        _, lib, engine, sync, _ = rows[key]
        fpb = bd.frames_per_batch("sync" if sync else None, spec["node_fpb"])
        batches = max(2, math.ceil(spec["frames"][1 if args.quick else 0] / fpb))
        return {
            "workload": w, "key": key, "lib": lib, "engine": engine, "sync": sync, "fpb": fpb,
            "role": None, "warm_batches": warm, "batches": batches, "total_frames": (warm + batches) * fpb,
            "heavy_work": bd.HEAVY_WORK, "gone_timeout": 30.0,
            "tcp_port": h.free_port_block(used_ports) if lib == "torchrl" and engine == "rpc" else None,
        }  # fmt: skip

    def logged(wk: tuple[str, str], _rep: int, _cfg: dict[str, Any], r: dict[str, Any]) -> None:
        fps, first = r.get("fps", math.nan), r.get("first_s", math.nan)
        what = r.get("error") or f"{fps:,.0f} frames/s, first {first:.2f} s"
        log(f"  {wk[0]:<8} {rows[wk[1]][4]:<38} {what}")

    plan = [(w, k) for w in workloads for k in keys]
    results = h.fresh_rounds(
        "bench_ray_rpc", plan, repeats, config, args.timeout, exit_grace=20.0, before_round=reference, on_result=logged
    )
    ref = h.median(floor)
    cols = [Col("workload", left=True), Col("collector", left=True)]
    cols += [Col(c) for c in ("fpb", "frames/s", "vs bare loop", "vs TorchRL", "first batch (s)", "/ import floor")]
    cols += [Col(c) for c in ("ray.init (s)", "close (ms)", "nodes gone (ms)", "ray.shutdown (ms)", "trainer CPU")]
    cols.append(Col("trainer CPU per batch (ms)"))
    table: list[list[str]] = []
    summary: dict[str, Any] = {"import_floor_s": ref, "rows": {}}
    for w in workloads:
        sums = {k: bd.summarize(results[(w, k)]) for k in keys}
        bare = sums.get("bare", {}).get("fps", math.nan)
        title = bd.WORKLOADS[w]["title"]
        for key in keys:
            s, (_, lib, engine, sync, label) = sums[key], rows[key]
            s.update(h.medians([r for r in results[(w, key)] if "error" not in r], ("engine_s", "engine_close_s")))
            twin = f"trl-{engine}-{'sync' if sync else 'async'}"
            vs_trl = h.div(s["fps"], sums[twin]["fps"]) if lib == "aiocollect" and twin in sums else math.nan
            summary["rows"][f"{w}/{key}"] = {**s, "vs_torchrl": vs_trl}
            fpb_cell = str(bd.frames_per_batch("sync" if sync else None, bd.WORKLOADS[w]["node_fpb"]))
            if s["ok"] == 0:
                table.append([title, label, fpb_cell, f"failed: {s['errors'][:1]}"])
                continue
            cpu = [h.fmt_pct(s["trainer_cpu"]), f"{s['trainer_ms_per_batch']:.1f}"]
            if lib == "bare":
                table.append([title, label, fpb_cell, h.fmt_n(s["fps"], sep=True), "1.00x", "-", f"{s['first_s']:.2f}",
                              "-", "-", "-", "-", "-", *cpu])  # fmt: skip
            else:
                table.append([
                    title, label, fpb_cell, h.fmt_n(s["fps"], sep=True), h.fmt_x(s["fps"] / bare),
                    h.fmt_x(vs_trl) if lib == "aiocollect" else "-", f"{s['first_s']:.2f}", h.fmt_x(s["first_s"] / ref),
                    h.fmt_n(s["engine_s"], 2).replace("n/a", "-"), _ms(s["close_s"]), _ms(s["gone_s"]),
                    _ms(s["engine_close_s"]).replace("n/a", "-"), *cpu,
                ])  # fmt: skip
            nodes_left = [r["left_alive"] for r in results[(w, key)] if r.get("left_alive")]
            if nodes_left:
                log(f"  LEAK: {w} {label}: node processes outlived the collector {nodes_left}")
            elif s["leaks"]:  # after the child exited: on the Ray rows, Ray's own agents
                log(f"  note: {w} {label}: processes outlived the run by 5 s (killed): {s['leaks']}")
    log(f'\nimport floor `python -c "{bd.REFERENCE_CMD}"`: {ref:.2f} s (median)\n')
    log("\n".join(h.markdown_table(cols, table)))
    run.footer()
    run.write_json(args.json, summary=summary, runs={f"{w}/{k}": v for (w, k), v in results.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
