#!/usr/bin/env python
"""Worker start-up of the multi-process collectors: first batch, later collectors, restarts.

Measures, in ONE run and side by side for every start method of ``--start-methods``
(default ``forkserver,spawn``), with aiocollect's public API only
(``aiocollect.blocking.MultiSyncCollector``, ``start_method=``, ``restart_workers=``,
``stats()``), so that it keeps working while the internals change:

1. the reference: the wall time of ``python -c "import torch, gymnasium"`` in a fresh process;
2. the first collector of a fresh process: in a new Python process per sample, the time from
   constructing ``MultiSyncCollector("CartPole-v1", policy, num_workers=2,
   frames_per_batch=64, total_frames=-1, start_method=M)`` to its first batch in hand, and
   its ratio to the reference;
3. later collectors of the same process: the same time for the next K collectors, one after
   another, in that process;
4. worker restart: a collector with ``restart_workers=1`` whose env kills its worker once
   (``os._exit(1)``); the time from the crash to the next batch in hand, minus the median
   time of a normal batch; ``stats().restarts`` must be 1;
5. for information: the import times of ``aiocollect`` and ``tensordict`` in a fresh process
   (what workers avoid), and (``--probe``, on by default in a full run) a timestamped
   breakdown of the first batch: worker process start, its imports, env, first step.

The output ends with PASS/FAIL lines and Markdown tables.

Usage::

    python benchmarks/bench_startup.py            # full run (about 5 min on 2 idle cores)
    python benchmarks/bench_startup.py --quick    # CI smoke (about 1 min on 2 idle cores)

See benchmarks/README.md for what each row means.

Everything a worker process needs (the policy class, the env factories) is defined at module
level here or in ``_workloads``, and these modules import only the standard library, numpy, torch
and gymnasium: workers re-import them to unpickle those, and they must not add imports of their
own to what is measured.
"""

from __future__ import annotations

import time

_T_MODULE = time.monotonic()  # in a worker: when unpickling its config imported this module

import argparse  # noqa: E402
import functools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from typing import Any  # noqa: E402

import gymnasium as gym  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h  # noqa: E402
import _workloads as wl  # noqa: E402
from _harness import Col, log  # noqa: E402

ENV_ID = "CartPole-v1"
NUM_WORKERS = 2
FPB = 64  # frames per batch, all workers together: 32 CartPole steps per worker
TARGETS = {
    "first_ratio": 1.3,  # first collector of a fresh process / `import torch, gymnasium`
    "later_s": 0.3,  # every later collector of the same process: construction -> first batch
    "restart_s": 0.5,  # crash -> next batch, minus a normal batch (median of the trials)
}
REFERENCE_CMD = "import torch, gymnasium"
NO_TEARDOWN_CMD = REFERENCE_CMD + "; import os; os._exit(0)"  # without interpreter teardown
CRASH_AFTER_BATCHES = 10  # the crashing worker dies at the first step of its 11th batch
BATCHES_AFTER_CRASH = 5  # normal batches collected after the restart

# --------------------------------------------------------------------------------------------
# What worker processes import: the env factories (module level: picklable). The policy is
# _workloads.DiscretePolicy.
# --------------------------------------------------------------------------------------------


def proc_started(pid: int | str = "self") -> float | None:
    """When process ``pid`` was created, on the ``time.monotonic()`` clock (Linux, 10 ms
    resolution), or None where /proc is not available."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        ticks = int(data[data.rindex(b")") + 2 :].split()[19])  # field 22: starttime
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


_WATCHED_MODULES = ("torch", "numpy", "gymnasium", "tensordict", "torchrl", "anyio", "aiocollect")


def _stamp(path: str, **extra: Any) -> None:
    """Write this worker's timestamps (monotonic clock) to ``path``, atomically."""
    info = {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "proc_started": proc_started(),
        "parent_started": proc_started(os.getppid()),
        "module_imported": _T_MODULE,
        "modules": {m: m in sys.modules for m in _WATCHED_MODULES},
        "n_aiocollect_modules": sum(1 for m in sys.modules if m.startswith("aiocollect")),
        **extra,
    }
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(info, f)
    os.replace(tmp, path)


class StampedEnv(gym.Wrapper):
    """CartPole that records, at its first step, when its worker process started, imported
    this module, built the env and stepped it (``stamp-<pid>.json`` in ``stamp_dir``).

    With ``crash_step``, it also kills its worker (``os._exit(1)``) at that step of the
    process, in the first process to get there only: the marker file ``crashed.json``, created
    with O_CREAT|O_EXCL, is claimed by one process; the restarted worker finds it taken and
    carries on."""

    def __init__(self, stamp_dir: str, crash_step: int | None, env_called: float) -> None:
        super().__init__(gym.make(ENV_ID))
        self._dir, self._crash_step = stamp_dir, crash_step
        self._env_called, self._env_built = env_called, time.monotonic()
        self._steps = 0

    def step(self, action: Any) -> Any:
        self._steps += 1
        if self._steps == 1:
            _stamp(
                os.path.join(self._dir, f"stamp-{os.getpid()}.json"),
                env_called=self._env_called,
                env_built=self._env_built,
                first_step=time.monotonic(),
            )
        if self._steps == self._crash_step:
            try:
                fd = os.open(os.path.join(self._dir, "crashed.json"), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                pass  # another worker crashed already, or this is the restarted one
            else:
                info = {"pid": os.getpid(), "step": self._steps, "crashed": time.monotonic()}
                os.write(fd, json.dumps(info).encode())
                os.close(fd)
                os._exit(1)
        return self.env.step(action)


def make_stamped_env(stamp_dir: str, crash_step: int | None = None) -> gym.Env:
    """The env factory of the probe and restart runs (``functools.partial`` of it pickles)."""
    return StampedEnv(stamp_dir, crash_step, time.monotonic())


def read_stamps(stamp_dir: str) -> list[dict[str, Any]]:
    return [
        _read_json(os.path.join(stamp_dir, n))
        for n in sorted(os.listdir(stamp_dir))
        if n.startswith("stamp-") and n.endswith(".json")
    ]


def _read_json(path: str) -> dict[str, Any]:
    with open(path) as f:
        return json.load(f)


# --------------------------------------------------------------------------------------------
# The child process: one fresh interpreter per sample of "first collector".
# --------------------------------------------------------------------------------------------


def child_main(cfg: dict[str, Any], t_start: float) -> dict[str, Any]:
    """Runs in a fresh process: the first collector, ``later`` more, ``restarts`` restart
    trials and, with ``probe``, a first and a second collector with timestamped envs."""
    import aiocollect

    # The class lookup imports what the parent needs for batches (tensordict, which imports
    # torch._dynamo): a script that looks the class up and builds it at once pays it too.
    # TorchRL's name from the package, as a script that changed its import line looks it up:
    # that lookup starts the fork server first, so its preload runs beside the import.
    t_lookup = time.perf_counter()
    from aiocollect import MultiSyncDataCollector as MultiSyncCollector

    lookup_s = time.perf_counter() - t_lookup
    torch.set_num_threads(1)
    policy = wl.seeded(wl.DiscretePolicy, 4, 2)
    method = cfg["start_method"]
    out: dict[str, Any] = {
        "pid": os.getpid(),
        "import_s": time.perf_counter() - t_start,  # torch, gymnasium, aiocollect's class
        "aiocollect_file": aiocollect.__file__,
        "aiocollect_version": aiocollect.__version__,
        "tensordict_in_child": "tensordict" in sys.modules,
        "lookup_s": lookup_s,
    }

    def make(env: Any, **extra: Any) -> Any:
        return MultiSyncCollector(
            env,
            policy,
            num_workers=cfg["num_workers"],
            frames_per_batch=cfg["fpb"],
            total_frames=-1,
            start_method=method,
            **extra,
        )

    def first_batch(env: Any) -> dict[str, Any]:
        t0 = time.monotonic()
        with make(env) as c:
            batch = next(c)
            t1 = time.monotonic()
            frames = batch.numel()
        t2 = time.monotonic()
        if frames != cfg["fpb"]:
            raise RuntimeError(f"first batch has {frames} frames, expected {cfg['fpb']}")
        return {"t0": t0, "first_s": t1 - t0, "t_first": t1, "close_s": t2 - t1}

    if cfg["probe"]:
        out["probe"] = []
        for _ in range(2):  # the process's first collector, then a later one
            d = tempfile.mkdtemp(prefix="bench_startup_probe_")
            try:
                r = first_batch(functools.partial(make_stamped_env, d))
                r["workers"] = read_stamps(d)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            r["child_pid"] = os.getpid()
            out["probe"].append(r)
        return out

    out["first"] = first_batch(ENV_ID)
    out["later"] = [first_batch(ENV_ID) for _ in range(cfg["later"])]
    out["restart"] = [restart_trial(make, cfg) for _ in range(cfg["restarts"])]
    return out


def restart_trial(make: Any, cfg: dict[str, Any]) -> dict[str, Any]:
    """One collector with ``restart_workers=1`` whose env crashes its worker once, at the first
    step of the worker's batch number CRASH_AFTER_BATCHES + 1 (each worker batch is
    ``fpb / num_workers`` steps of one CartPole). Every ``next()`` is timed on the monotonic
    clock, which the crashing worker also uses to stamp its crash."""
    steps_per_batch = math.ceil(cfg["fpb"] / cfg["num_workers"])
    crash_step = CRASH_AFTER_BATCHES * steps_per_batch + 1
    d = tempfile.mkdtemp(prefix="bench_startup_crash_")
    out: dict[str, Any] = {"crash_step": crash_step}
    try:
        _restart_trial(make, d, crash_step, out)
    except Exception as exc:  # a failed restart is a result (FAIL), not the child's end
        out["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return out


def _restart_trial(make: Any, d: str, crash_step: int, out: dict[str, Any]) -> None:
    """Run the trial with the stamps and marker in ``d``; record the results in ``out``."""
    batches: list[tuple[float, float, int]] = []  # (start, end, restarts seen after it)
    t0 = time.monotonic()
    with make(functools.partial(make_stamped_env, d, crash_step), restart_workers=1) as c:
        crash_at = None
        limit = CRASH_AFTER_BATCHES + BATCHES_AFTER_CRASH + 200  # if the crash never comes
        while len(batches) < limit:
            start = time.monotonic()
            next(c)
            end = time.monotonic()
            batches.append((start, end, c.stats().restarts))
            if crash_at is None and batches[-1][2] > 0:
                crash_at = len(batches) - 1
            if crash_at is not None and len(batches) > crash_at + BATCHES_AFTER_CRASH:
                break
        stats = c.stats()
    out["close_s"] = time.monotonic() - batches[-1][1]
    out["restarts"] = stats.restarts
    out["dropped_batches"] = stats.dropped_batches
    out["first_s"] = batches[0][1] - t0
    marker = os.path.join(d, "crashed.json")
    if not os.path.exists(marker):
        out["error"] = f"no worker crashed in {len(batches)} batches"
        return
    crash = _read_json(marker)
    out["crashed_step"] = crash["step"]
    t_crash = crash["crashed"]
    # The batch in flight when the worker died: the first one to end after the crash.
    span = next(i for i, (_, end, _) in enumerate(batches) if end > t_crash)
    normal = [e - s for i, (s, e, _) in enumerate(batches) if i not in (0, span)]
    out["normal_batch_s"] = h.median(normal)
    out["span_index"] = span
    out["restarts_before_span"] = batches[span - 1][2] if span else 0
    out["restarts_after_span"] = batches[span][2]
    out["crash_to_batch_s"] = batches[span][1] - t_crash
    out["restart_s"] = out["crash_to_batch_s"] - out["normal_batch_s"]
    out["span_s"] = batches[span][1] - batches[span][0]
    out["span_minus_normal_s"] = out["span_s"] - out["normal_batch_s"]
    # The restarted worker: the one whose process started after the crash.
    stamps = read_stamps(d)
    out["worker_modules"] = [w["modules"] for w in stamps]  # at each worker's first step
    news = [w for w in stamps if w["env_built"] > t_crash]
    if news:
        w = news[0]
        out["new_worker"] = {
            k: (w[k] - t_crash if w.get(k) is not None else None)
            for k in ("proc_started", "module_imported", "env_built", "first_step")
        }


def _child_entry(cfg_json: str, t_start: float) -> None:
    """``python -c`` entry point of a child (see `_harness.run_child`)."""
    h.child_entry(child_main, cfg_json, t_start)


# --------------------------------------------------------------------------------------------
# Summaries
# --------------------------------------------------------------------------------------------


def probe_phases(p: dict[str, Any]) -> dict[str, float]:
    """Phases of one probed collector's first batch, from its slowest worker's stamps:
    seconds since construction (``t0``) at which each point was reached."""
    t0, ws = p["t0"], p["workers"]
    if not ws:
        return {}

    def last(key: str) -> float:
        vals = [w[key] for w in ws if w.get(key) is not None]
        return max(vals) - t0 if vals else math.nan

    out = {}
    if any(w["ppid"] != p["child_pid"] for w in ws):  # forked by a fork server
        out["server_started"] = last("parent_started")
    out["worker_started"] = last("proc_started")
    out["worker_imported"] = last("module_imported")
    out["env_built"] = last("env_built")
    out["first_step"] = last("first_step")
    out["first_batch"] = p["t_first"] - t0
    return out


PHASE_LABELS = {
    "server_started": "fork server process started",
    "worker_started": "worker process started",
    "worker_imported": "worker's imports done (config unpickled)",
    "env_built": "env built",
    "first_step": "first env step",
    "first_batch": "first batch in hand",
}


def summarize(method: str, children: list[dict[str, Any]], ref: float) -> dict[str, Any]:
    ok = [c for c in children if "error" not in c]
    firsts = [c["first"]["first_s"] for c in ok]
    later = [r["first_s"] for c in ok for r in c["later"]]
    trials = [t for c in ok for t in c["restart"]]
    good = [t for t in trials if "restart_s" in t]
    s: dict[str, Any] = {
        "start_method": method,
        "children": len(children),
        "errors": [c["error"] for c in children if "error" in c],
        "left_alive": [c["group_left_alive"] for c in children if c.get("group_left_alive")],
        "child_import_s": h.median([c["import_s"] for c in ok]),
        "first_s": h.median(firsts),
        "first_runs_s": firsts,
        "first_ratio": h.div(h.median(firsts), ref),
        # As a script that imports aiocollect, then looks the class up and builds it, sees it.
        "first_with_lookup_s": h.median([c["lookup_s"] + c["first"]["first_s"] for c in ok]),
        "lookup_s": h.median([c["lookup_s"] for c in ok]),
        "later_median_s": h.median(later),
        "later_max_s": max(later) if later else math.nan,
        "later_runs_s": later,
        "restart_s": h.median([t["restart_s"] for t in good]),
        "restart_max_s": max((t["restart_s"] for t in good), default=math.nan),
        "restart_span_minus_normal_s": h.median([t["span_minus_normal_s"] for t in good]),
        "normal_batch_s": h.median([t["normal_batch_s"] for t in good]),
        "restarts_seen": [t.get("restarts") for t in trials],
        "restart_errors": [t["error"] for t in trials if "error" in t],
        "restart_trials": trials,
    }
    news = [t["new_worker"] for t in good if "new_worker" in t]
    if news:
        s["restart_phases"] = h.medians(news, ("proc_started", "module_imported", "env_built", "first_step"))
        s["restart_phases"]["next_batch"] = h.median([t["crash_to_batch_s"] for t in good])
    return s


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> Any:
    ap = h.parser(
        __doc__,
        quick="short CI smoke run (about 1 min)",
        repeats="fresh processes per start method (default 5; 2 with --quick); the reference is "
        "sampled as often, at least 3 times",
    )
    ap.add_argument(
        "--start-methods",
        default="forkserver,spawn",
        help="comma-separated start methods to compare (default: forkserver,spawn)",
    )
    ap.add_argument(
        "--later",
        type=int,
        default=None,
        help="later collectors per fresh process (default 5; 3 with --quick, first process only)",
    )
    ap.add_argument(
        "--restarts",
        type=int,
        default=None,
        help="worker-restart trials per start method, one per fresh process (default 3; 1 with --quick)",
    )
    ap.add_argument(
        "--probe",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="one more fresh process per start method with timestamped envs, for the "
        "first-batch breakdown (default: on; off with --quick)",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        help="seconds a child process may run before it and its workers are killed (default 300)",
    )
    return ap.parse_args(argv)


def log_child(m: str, c: dict[str, Any]) -> None:
    """One fresh process's results, or its error with the end of its traceback."""
    if "error" in c:
        log(f"    {m:<10} ERROR {c['error']}")
        for t in (c.get("traceback") or c.get("stderr") or "").strip().splitlines()[-15:]:
            log(f"      {t}")
        return
    msg = f"    {m:<10} imports {c['import_s']:.2f} s, first collector {c['first']['first_s']:.2f} s"
    if c["later"]:
        msg += ", later " + " ".join(f"{r['first_s']:.3f}" for r in c["later"])
    for t in c["restart"]:
        if "restart_s" in t:
            msg += (
                f", restart {t['restart_s']:.3f} s (crash->batch {t['crash_to_batch_s']:.3f}, "
                f"batch {t['normal_batch_s'] * 1e3:.1f} ms, restarts={t['restarts']})"
            )
        else:
            msg += f", restart trial: {t.get('error')}"
    if c["group_left_alive"]:
        msg += f"; WARNING: killed leftover processes {c['group_left_alive']}"
    log(msg)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    quick = args.quick
    n = args.repeats or (2 if quick else 5)
    rounds = max(n, 3)  # reference samples
    later = args.later if args.later is not None else (3 if quick else 5)
    restarts = args.restarts if args.restarts is not None else (1 if quick else 3)
    probe = args.probe if args.probe is not None else not quick
    methods = [m.strip() for m in args.start_methods.split(",") if m.strip()]

    import aiocollect  # lazy: this does not import tensordict

    run = h.Session("torch", "tensordict", "gymnasium", aiocollect=aiocollect.__version__)
    run.header(
        f"bench_startup: {'QUICK' if quick else 'full'} run; start methods {', '.join(methods)}; "
        f"{n} fresh processes each; {later} later collectors per process"
        f"{' (first process only)' if quick else ''}; {restarts} restart trial(s)",
        sys.executable,
        f"aiocollect from {os.path.dirname(aiocollect.__file__)}",
        f"collector: aiocollect.blocking.MultiSyncCollector({ENV_ID!r}, 64-64 MLP, "
        f"num_workers={NUM_WORKERS}, frames_per_batch={FPB}, total_frames=-1, start_method=M)",
    )

    # Fresh-process wall times printed for information, next to the reference.
    info_cmds = ["pass", "import aiocollect", "import tensordict", NO_TEARDOWN_CMD]
    ref_runs: list[float] = []
    info_runs: dict[str, list[float]] = {k: [] for k in info_cmds}

    def reference(i: int) -> None:
        ref_runs.append(h.time_command(REFERENCE_CMD, args.timeout))
        for code in info_cmds:
            if not (quick and i > 0):  # informational: one sample is enough for a smoke run
                info_runs[code].append(h.time_command(code, args.timeout))
        log(f"  round {i + 1}/{rounds}: `{REFERENCE_CMD}` {ref_runs[-1]:.2f} s")

    def config(m: str, i: int) -> dict[str, Any]:
        return {
            "start_method": m,
            "num_workers": NUM_WORKERS,
            "fpb": FPB,
            "later": later if (i == 0 or not quick) else 0,
            "restarts": 1 if i < restarts else 0,
            "probe": False,
        }

    log("\n[1/2] fresh processes, round robin (reference, imports, one child per start method)")
    children = h.fresh_rounds(
        "bench_startup", methods, n, config, args.timeout, rounds=rounds, before_round=reference,
        on_result=lambda m, _i, _cfg, c: log_child(m, c),
    )  # fmt: skip
    probes: dict[str, dict[str, Any]] = {}
    if probe:
        log("\n[2/2] probe: one more fresh process per start method, timestamped envs")
        for m in methods:
            cfg = {"start_method": m, "num_workers": NUM_WORKERS, "fpb": FPB, "probe": True}
            c = h.run_child("bench_startup", cfg, args.timeout)
            if "error" in c:
                log(f"    {m:<10} ERROR {c['error']}")
                probes[m] = {"error": c["error"]}
                continue
            ph = [probe_phases(p) for p in c["probe"]]
            mods = sorted({k for p in c["probe"] for w in p["workers"] for k, v in w["modules"].items() if v})
            probes[m] = {"phases": ph, "worker_modules": mods, "raw": c}
            log(
                f"    {m:<10} first {ph[0].get('first_batch', math.nan):.2f} s, second "
                f"{ph[1].get('first_batch', math.nan):.3f} s; in the workers: {', '.join(mods)}"
            )
    else:
        log("\n[2/2] probe skipped")

    ref = h.median(ref_runs)
    info = {k: h.median(v) for k, v in info_runs.items()}
    info[REFERENCE_CMD] = ref
    summ = {m: summarize(m, children[m], ref) for m in methods}
    for m in methods:
        summ[m]["probe"] = probes.get(m)
        # Every worker that stamped its first step: restart trials and the probe.
        mods = [w for t in summ[m]["restart_trials"] for w in t.get("worker_modules", [])]
        if probes.get(m) and "raw" in probes[m]:
            mods += [w["modules"] for p in probes[m]["raw"]["probe"] for w in p["workers"]]
        summ[m]["workers_stamped"] = len(mods)
        summ[m]["workers_tensordict"] = sum(1 for w in mods if w["tensordict"])

    checks = h.Checks()
    targets(checks, methods, summ, probes, ref)
    rows = result_rows(methods, summ, ref, n, rounds)
    cols = [Col("", left=True), *(Col(m, width=11) for m in methods), Col("target", left=True)]
    log("\n" + "=" * 110)
    log("RESULTS (seconds; medians unless stated)")
    for line in h.console_table(cols, rows):
        log(line)

    log("\nFresh-process import times (wall time of `python -c ...`, for information):")
    for k, v in info.items():
        ref_note = "  (the reference)" if k == REFERENCE_CMD else ""
        log(f'  python -c "{k}"{"":<{max(0, 52 - len(k))}} {h.fmt_s(v):>7} s{ref_note}')
    log(
        f"  {'in a child: torch, gymnasium, aiocollect.blocking.MultiSyncCollector':<55} "
        + " ".join(f"{h.fmt_s(summ[m]['child_import_s']):>7} s ({m})" for m in methods)
    )
    phase_md = probe_table(methods, probes) if probe else []
    restart_md = restart_table(methods, summ)
    checks.report()

    md_cols = [Col("", left=True), *(Col(f"`{m}`") for m in methods), Col("target", left=True)]
    md = h.markdown_table(md_cols, rows)
    md += ["", *h.markdown_table([Col("fresh process, wall time", left=True), Col("s")], [
        [f'`python -c "{k}"`{" (the reference)" if k == REFERENCE_CMD else ""}', h.fmt_s(v)] for k, v in info.items()
    ])]  # fmt: skip
    if phase_md:
        md += ["", *phase_md]
    if restart_md:
        md += ["", *restart_md]
    versions = run.versions_line("python", "torch", "tensordict", "gymnasium", "aiocollect")
    md += [
        "",
        f"_{versions}; {os.cpu_count()} CPUs; `MultiSyncCollector` (blocking) on {ENV_ID}, {NUM_WORKERS} workers, "
        f"{FPB} frames per batch, 64-64 MLP; {n} fresh processes per start method, interleaved with the reference._",
    ]
    log("\nMarkdown:\n")
    log("\n".join(md))
    run.footer()
    settings = {
        "quick": quick,
        "start_methods": methods,
        "repeats": n,
        "later": later,
        "restarts": restarts,
        "probe": probe,
        "num_workers": NUM_WORKERS,
        "frames_per_batch": FPB,
        "env": ENV_ID,
        "targets": TARGETS,
    }
    run.write_json(
        args.json,
        settings=settings,
        reference_cmd=REFERENCE_CMD,
        reference_s=ref,
        reference_runs_s=ref_runs,
        imports_s=info,
        imports_runs_s=info_runs,
        start_methods=summ,
        children=children,
        checks=checks.as_json(),
    )
    return checks.exit_code(args.strict)


def targets(checks: h.Checks, methods: list[str], summ: dict[str, Any], probes: dict[str, Any], ref: float) -> None:
    for m in methods:
        s = summ[m]
        errors = s["errors"] + ([probes[m]["error"]] if "error" in probes.get(m, {}) else [])
        if errors:
            checks.add(f"{m}: every fresh process ran to the end", False, "; ".join(errors))
        lim = TARGETS["first_ratio"]
        checks.add(
            f"{m}: first collector of a fresh process <= {lim:g}x `{REFERENCE_CMD}`",
            s["first_ratio"] <= lim if math.isfinite(s["first_ratio"]) else False,
            f"{h.fmt_x(s['first_ratio'])} ({h.fmt_s(s['first_s'])} s vs {h.fmt_s(ref)} s)",
        )
        with_lookup = h.div(s["first_with_lookup_s"], ref)
        checks.add(
            f"{m}: first collector, counting the class lookup, <= {lim:g}x `{REFERENCE_CMD}`",
            with_lookup <= lim if math.isfinite(with_lookup) else False,
            f"{h.fmt_x(with_lookup)} ({h.fmt_s(s['first_with_lookup_s'])} s: lookup {h.fmt_s(s['lookup_s'])} s)",
        )
        lim = TARGETS["later_s"]
        checks.add(
            f"{m}: every later collector of the same process < {lim:g} s",
            s["later_max_s"] < lim if s["later_runs_s"] else None,
            f"max {h.fmt_s(s['later_max_s'])} s, median {h.fmt_s(s['later_median_s'])} s "
            f"({len(s['later_runs_s'])} collectors)",
        )
        lim = TARGETS["restart_s"]
        good = math.isfinite(s["restart_s"])
        checks.add(
            f"{m}: worker restart (crash -> next batch, minus a normal batch) < {lim:g} s",
            (s["restart_s"] < lim if good else False) if s["restart_trials"] else None,
            f"median {h.fmt_s(s['restart_s'])} s, max {h.fmt_s(s['restart_max_s'])} s "
            f"({len(s['restart_trials'])} trials)"
            + (f"; {'; '.join(s['restart_errors'])}" if s["restart_errors"] else ""),
        )
        if s["restart_trials"]:
            ok = all(r == 1 for r in s["restarts_seen"])
            checks.add(f"{m}: stats().restarts == 1 after each restart trial", ok, str(s["restarts_seen"]))
        leftover = s["left_alive"]
        value = "none" if not leftover else f"killed {leftover}"
        checks.add(f"{m}: no process left alive after a child exits", not leftover, value)


def result_rows(methods: list[str], summ: dict[str, Any], ref: float, n: int, rounds: int) -> list[list[str]]:
    """The results table: a label, one cell per start method, the target."""
    n_later = max((len(summ[m]["later_runs_s"]) for m in methods), default=0)
    n_trials = max((len(summ[m]["restart_trials"]) for m in methods), default=0)
    spec: list[tuple[str, Any, str]] = [
        (f"first collector of a fresh process: construction -> first batch (s, median of {n})",
         lambda s: h.fmt_s(s["first_s"]), ""),
        (f'... / `python -c "{REFERENCE_CMD}"` ({h.fmt_s(ref)} s, median of {rounds})',
         lambda s: h.fmt_x(s["first_ratio"]), f"<= {TARGETS['first_ratio']:g}x"),
        ("the same, counting the class lookup `from aiocollect import MultiSyncDataCollector` (s)",
         lambda s: h.fmt_s(s["first_with_lookup_s"]), ""),
        ("... of which the class lookup (s)", lambda s: h.fmt_s(s["lookup_s"]), ""),
        ("... / the reference", lambda s: h.fmt_x(h.div(s["first_with_lookup_s"], ref)),
         f"<= {TARGETS['first_ratio']:g}x"),
        ("later collectors of the same process: median (s)", lambda s: h.fmt_s(s["later_median_s"]), ""),
        (f"later collectors: max (s, of {n_later})", lambda s: h.fmt_s(s["later_max_s"]),
         f"< {TARGETS['later_s']:g} s"),
        (f"worker restart: crash -> next batch, minus a normal batch (s, median of {n_trials})",
         lambda s: h.fmt_s(s["restart_s"]), f"< {TARGETS['restart_s']:g} s"),
        ("worker restart: the `next()` that spans the crash, minus a normal batch (s)",
         lambda s: h.fmt_s(s["restart_span_minus_normal_s"]), ""),
        ("normal batch (ms)", lambda s: h.fmt_ms(s["normal_batch_s"]), ""),
        ("`stats().restarts` after each trial", lambda s: ", ".join(str(r) for r in s["restarts_seen"]) or "-", "1"),
        ("workers that had imported tensordict at their first env step",
         lambda s: f"{s['workers_tensordict']}/{s['workers_stamped']}", ""),
    ]  # fmt: skip
    return [[label, *(cell(summ[m]) for m in methods), target] for label, cell, target in spec]


def probe_table(methods: list[str], probes: dict[str, Any]) -> list[str]:
    """Print the probe's first-batch breakdown; return it as Markdown (empty if none ran)."""
    cols = [(m, i, probes[m]["phases"][i]) for m in methods if "phases" in probes.get(m, {}) for i in range(2)]
    if not cols:
        return []
    heads = [f"{m} {'1st' if i == 0 else '2nd'}" for m, i, _ in cols]
    log("\nFirst-batch breakdown (probe): seconds after construction at which the slowest worker reached each point")
    rows = []
    for key, label in PHASE_LABELS.items():
        vals = [ph.get(key) for _, _, ph in cols]
        if all(v is None for v in vals):
            continue
        # A fork server started by an earlier collector of the process: "earlier".
        rows.append([label, *("-" if v is None else "earlier" if v < 0 else h.fmt_s(v) for v in vals)])
    table = [Col("", width=42, left=True), *(Col(hd, width=15) for hd in heads)]
    for line in h.console_table(table, rows):
        log("  " + line)
    mods = "; ".join(f"{m}: {', '.join(probes[m]['worker_modules'])}" for m in methods if "phases" in probes.get(m, {}))
    log(f"  modules loaded in the workers at their first step: {mods}")
    md_cols = [Col("seconds after construction (slowest worker)", left=True), *(Col(hd) for hd in heads)]
    return h.markdown_table(md_cols, rows)


def restart_table(methods: list[str], summ: dict[str, Any]) -> list[str]:
    """Print the worker-restart breakdown; return it as Markdown (empty if no trial ran)."""
    if not any("restart_phases" in summ[m] for m in methods):
        return []
    log("\nWorker restart breakdown: seconds after the crash (median of the trials)")
    labels = {
        "proc_started": "new worker process started",
        "module_imported": "its imports done (config unpickled)",
        "env_built": "its env built",
        "first_step": "its first env step",
        "next_batch": "next batch in hand",
    }
    rows = [
        [label, *(h.fmt_s(summ[m].get("restart_phases", {}).get(key, math.nan)) for m in methods)]
        for key, label in labels.items()
    ]
    for line in h.console_table([Col("", width=42, left=True), *(Col(m, width=11) for m in methods)], rows):
        log("  " + line)
    return h.markdown_table([Col("seconds after the crash", left=True), *(Col(m) for m in methods)], rows)


if __name__ == "__main__":
    sys.exit(main())
