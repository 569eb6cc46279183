#!/usr/bin/env python
"""RPC and Ray collectors side by side: first batch, throughput, shutdown, trainer CPU.

Compares, in ONE run and on the workloads of ``bench_distributed.py`` (CartPole-v1 and the
~1 ms CPU-heavy env, its 64-64 MLP policy, 2 collection nodes, one env per node,
``collector_class`` = the single-env collector in both libraries):

* aiocollect's ``RPCCollector`` (``launcher="mp"``) and ``RayCollector``, ``sync=True`` and
  ``sync=False`` (their blocking twins in a plain ``for`` loop);
* TorchRL's ``RPCCollector`` (``launcher="mp"``) and ``RayCollector``, the same modes;
* the single-process bare loop (throughput reference, ratio 1.00).

Every configuration runs in a fresh Python process (``bench_distributed.run_process``). For
the Ray rows that process starts a local Ray first (``num_cpus=2``, on 127.0.0.1; both
libraries join it and leave it running), so "first batch" is measured after the engine is up
and ``ray.init`` is its own column, as is ``ray.shutdown`` after the collector closed. Actors
get ``{"num_cpus": 1}`` in both libraries. The first batch is compared with
``python -c "import torch, gymnasium"`` measured in the same run.

Usage::

    python benchmarks/bench_ray_rpc.py            # full run (3 fresh processes per row)
    python benchmarks/bench_ray_rpc.py --quick    # smoke run (1 process per row, fewer frames)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import socket
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
# Loopback only, and before anything imports ray: Ray otherwise uses the default route's address.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("TP_SOCKET_IFNAME", "lo")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")

import bench_distributed as bd  # noqa: E402 - after the environment above

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
RESULT_TAG = bd.RESULT_TAG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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


def _ray_nodes(psutil: Any) -> list[Any]:
    """Ray actor processes (``ray::<Class>``), not Ray's own processes or idle workers."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if cmd.startswith("ray::") and cmd.split()[0] not in _RAY_OWN:
            out.append(p)
    return out


def _child_entry(cfg_json: str, t_start: float) -> None:
    """``python -c`` entry point of one configuration (see `run_child`)."""
    cfg = json.loads(cfg_json)
    extra: dict[str, Any] = {}
    ray = None
    try:
        if cfg["engine"] == "ray":
            import ray

            t = time.perf_counter()
            path = os.pathsep.join([HERE, os.path.dirname(HERE), os.environ.get("PYTHONPATH", "")])
            ray.init(num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": path}})  # fmt: skip
            extra["engine_s"] = time.perf_counter() - t
        res = bd.child_main(cfg, t_start, make=_make, find_nodes=_ray_nodes if ray else None)
    except BaseException as exc:  # reported to the parent as data
        import traceback

        res = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-3000:]}
    if ray is not None and ray.is_initialized():
        t = time.perf_counter()
        ray.shutdown()
        extra["engine_close_s"] = time.perf_counter() - t
    res.update(extra)
    print(RESULT_TAG + json.dumps(res), flush=True)


def run_child(cfg: dict[str, Any], timeout: float) -> dict[str, Any]:
    code = (
        "import time; _t = time.perf_counter(); import sys; "
        f"sys.path.insert(0, {HERE!r}); import bench_ray_rpc; bench_ray_rpc._child_entry(sys.argv[1], _t)"
    )
    return bd.run_process([sys.executable, "-c", code, json.dumps(cfg)], timeout, 20.0)


def _ms(x: float) -> str:
    return bd.fmt_n(x * 1e3, sep=True) if math.isfinite(x) else "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 1 process per row, fewer frames")
    ap.add_argument("--repeats", type=int, default=None, help="fresh processes per row (default 3, 1 with --quick)")
    ap.add_argument("--workload", action="append", choices=list(bd.WORKLOADS), help="only this workload")
    ap.add_argument("--config", action="append", choices=[c[0] for c in CONFIGS], help="only this row")
    ap.add_argument("--timeout", type=float, default=240.0, help="seconds per configuration before it is killed")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args(argv)
    repeats, warm = args.repeats or (1 if args.quick else 3), 2 if args.quick else 3
    workloads = args.workload or list(bd.WORKLOADS)
    keys = args.config or [c[0] for c in CONFIGS]
    rows = {c[0]: c for c in CONFIGS}
    print(f"bench_ray_rpc: {repeats} fresh process(es) per row, {bd.NUM_NODES} nodes; "
          f"{platform.platform()}, {os.cpu_count()} CPUs, load {bd._loadavg():.2f}", flush=True)  # fmt: skip
    floor: list[float] = []
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(w, k): [] for w in workloads for k in keys}
    for rep in range(repeats):
        floor.append(bd.time_command(bd.REFERENCE_CMD, args.timeout))
        print(f"round {rep + 1}: import floor {floor[-1]:.2f} s", flush=True)
        for w in workloads:
            spec = bd.WORKLOADS[w]
            for key in keys:
                _, lib, engine, sync, label = rows[key]
                fpb = bd.frames_per_batch("sync" if sync else None, spec["node_fpb"])
                batches = max(2, math.ceil(spec["frames"][1 if args.quick else 0] / fpb))
                cfg = {
                    "workload": w, "key": key, "lib": lib, "engine": engine, "sync": sync, "fpb": fpb,
                    "role": None, "warm_batches": warm, "batches": batches, "total_frames": (warm + batches) * fpb,
                    "heavy_work": bd.HEAVY_WORK, "gone_timeout": 30.0,
                    "tcp_port": _free_port() if lib == "torchrl" and engine == "rpc" else None,
                }  # fmt: skip
                r = run_child(cfg, args.timeout)
                results[(w, key)].append(r)
                fps, first = r.get("fps", math.nan), r.get("first_s", math.nan)
                what = r.get("error") or f"{fps:,.0f} frames/s, first {first:.2f} s"
                print(f"  {w:<8} {label:<38} {what}", flush=True)
    ref = bd._median(floor)
    table = [
        "| workload | collector | fpb | frames/s | vs bare loop | vs TorchRL | first batch (s) | / import floor "
        "| ray.init (s) | close (ms) | nodes gone (ms) | ray.shutdown (ms) | trainer CPU "
        "| trainer CPU per batch (ms) |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    summary: dict[str, Any] = {"import_floor_s": ref, "rows": {}}
    for w in workloads:
        sums = {k: bd.summarize(results[(w, k)]) for k in keys}
        bare = sums.get("bare", {}).get("fps", math.nan)
        for key in keys:
            s, (_, lib, engine, sync, label) = sums[key], rows[key]
            runs = [r for r in results[(w, key)] if "error" not in r]
            s["engine_s"] = bd._median([r.get("engine_s") for r in runs])
            s["engine_close_s"] = bd._median([r.get("engine_close_s") for r in runs])
            twin = f"trl-{engine}-{'sync' if sync else 'async'}"
            vs_trl = s["fps"] / sums[twin]["fps"] if lib == "aiocollect" and twin in sums else math.nan
            summary["rows"][f"{w}/{key}"] = {**s, "vs_torchrl": vs_trl}
            fpb = bd.frames_per_batch("sync" if sync else None, bd.WORKLOADS[w]["node_fpb"])
            if s["ok"] == 0:
                table.append(f"| {bd.WORKLOADS[w]['title']} | {label} | {fpb} | failed: {s['errors'][:1]} |")
                continue
            table.append(
                f"| {bd.WORKLOADS[w]['title']} | {label} | {fpb} | {bd.fmt_n(s['fps'], sep=True)} "
                f"| {bd.fmt_x(s['fps'] / bare)} | {bd.fmt_x(vs_trl) if lib == 'aiocollect' else '-'} "
                f"| {s['first_s']:.2f} | {bd.fmt_x(s['first_s'] / ref)} "
                f"| {bd.fmt_n(s['engine_s'], 2).replace('n/a', '-')} | {_ms(s['close_s'])} | {_ms(s['gone_s'])} "
                f"| {_ms(s['engine_close_s']).replace('n/a', '-')} "
                f"| {bd.fmt_pct(s['trainer_cpu'])} | {s['trainer_ms_per_batch']:.1f} |"
                if lib != "bare" else
                f"| {bd.WORKLOADS[w]['title']} | {label} | {fpb} | {bd.fmt_n(s['fps'], sep=True)} | 1.00x | - "
                f"| {s['first_s']:.2f} | - | - | - | - | - | {bd.fmt_pct(s['trainer_cpu'])} "
                f"| {s['trainer_ms_per_batch']:.1f} |"
            )  # fmt: skip
            nodes_left = [r["left_alive"] for r in results[(w, key)] if r.get("left_alive")]
            if nodes_left:
                print(f"  LEAK: {w} {label}: node processes outlived the collector {nodes_left}", flush=True)
            elif s["leaks"]:  # after the child exited: on the Ray rows, Ray's own agents
                print(f"  note: {w} {label}: processes outlived the run by 5 s (killed): {s['leaks']}", flush=True)
    print(f'\nimport floor `python -c "{bd.REFERENCE_CMD}"`: {ref:.2f} s (median)\n')
    print("\n".join(table))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"summary": summary, "runs": {f"{w}/{k}": v for (w, k), v in results.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
