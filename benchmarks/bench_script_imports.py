#!/usr/bin/env python
"""A training script's first batch when it imports its collector at the top, as scripts do.

Worker processes re-import the script that started them (multiprocessing runs it as
``__mp_main__``), so whatever it imports at its top, every worker imports again unless the fork
server already has it. A script shaped like TorchRL's examples (``from aiocollect import
MultiSyncDataCollector`` and ``from tensordict.nn import TensorDictModule`` at the top, the
collector built under ``if __name__ == "__main__":``) is run as a fresh process per sample,
side by side, in one run:

* ``aiocollect``: as shipped (the fork server preloads what the script's top imports from
  aiocollect, tensordict and torchrl: ``_workers/_main_imports.py``);
* ``aiocollect, not preloaded``: the same, with that preload patched off (the old path);
* ``TorchRL``: the same script with TorchRL's ``MultiSyncDataCollector`` and ``GymEnv``
  (optional: skipped without TorchRL, or with ``--no-torchrl``).

For each: the whole script to its first batch, and its ratio to the import floor
(``python -c "import torch, gymnasium"``) and to that floor with tensordict, which the script
imports itself; construction to first batch; the private memory
(USS) of each worker and the CPU the workers spent up to the first batch. CartPole, a
``TensorDictModule`` over the benchmarks' 64-64 MLP, 32 steps per worker and batch.

Usage::

    python benchmarks/bench_script_imports.py                 # 2, 4 and 8 workers, 3 processes per row
    python benchmarks/bench_script_imports.py --workers 4 --repeats 5
    python benchmarks/bench_script_imports.py --quick         # CI smoke
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the sibling modules, from any cwd
import _harness as h
from _harness import Col, log

ROWS = ("aiocollect", "aiocollect, not preloaded", "TorchRL")
STEPS = 32  # per worker and batch

# The script each sample runs. Its top is what a user's script looks like; the config comes
# from the environment, which the workers that re-import the script see too.
SCRIPT = """
import time

_T0 = time.perf_counter()
import json
import os
import sys

CFG = json.loads(os.environ["BENCH_SCRIPT_CFG"])
sys.path.insert(0, CFG["benchmarks"])
if __name__ == "__main__" and CFG["row"] == "aiocollect, not preloaded":
    import aiocollect._workers._main_imports as _mi

    _mi.main_imports = lambda: []  # the old path: the fork server preloads none of the script's imports

import gymnasium
import torch
{collector_import}
from tensordict.nn import TensorDictModule

import _workloads as wl

_T_IMPORTS = time.perf_counter()


{make_env}

if __name__ == "__main__":
    import _harness as h

    n = CFG["workers"]
    torch.set_num_threads(1)
    policy = TensorDictModule(wl.seeded(wl.DiscretePolicy, 4, 2), in_keys=["observation"], out_keys=["action"])
    t_build = time.perf_counter()
    c = MultiSyncDataCollector([make_env] * n, policy, frames_per_batch={steps} * n, total_frames=-1)
    for batch in c:
        break
    t_first = time.perf_counter()
    workers, _ = h.child_processes()  # the fork server and the resource tracker are helpers
    out = {{
        "frames": batch.numel(), "imports_s": _T_IMPORTS - _T0, "first_s": t_first - t_build,
        "script_s": t_first - _T0, "uss_mb": [p.memory_full_info().uss / 2**20 for p in workers],
        "cpu_s": sum(sum(p.cpu_times()[:2]) for p in workers), "n_workers": len(workers),
    }}
    c.shutdown()
    print("BENCH_RESULT " + json.dumps(out), flush=True)
"""

AIOCOLLECT = dict(
    collector_import="from aiocollect import MultiSyncDataCollector",
    make_env='def make_env():\n    return gymnasium.make("CartPole-v1")',
)
TORCHRL = dict(
    collector_import=(
        "try:\n    from torchrl.collectors import MultiSyncDataCollector\n"
        "except ImportError:  # TorchRL 0.14 renamed it\n"
        "    from torchrl.collectors import MultiSyncCollector as MultiSyncDataCollector\n"
        "from torchrl.envs import GymEnv"
    ),
    make_env='def make_env():\n    return GymEnv("CartPole-v1", categorical_action_encoding=True)',
)


def main(argv: list[str] | None = None) -> int:
    ap = h.parser(
        __doc__,
        quick="CI smoke: 2 workers, 1 process per row",
        repeats="fresh processes per row (default 3; 1 with --quick)",
        no_torchrl="skip the TorchRL row",
        strict=False,
    )
    ap.add_argument("--workers", type=int, nargs="+", default=None, help="worker counts (default 2 4 8)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds a sample may take (default 300)")
    args = ap.parse_args(argv)
    repeats = args.repeats or (1 if args.quick else 3)
    counts = args.workers or ([2] if args.quick else [2, 4, 8])
    skip = h.torchrl_note(args.no_torchrl)
    rows = [r for r in ROWS if r != "TorchRL" or skip is None]

    import aiocollect  # lazy: this does not import tensordict

    run = h.Session("torch", "tensordict", "gymnasium", "torchrl", aiocollect=aiocollect.__version__)
    run.header(
        f"bench_script_imports: {'QUICK' if args.quick else 'full'} run; workers {counts}; "
        f"{repeats} fresh processes per row",
        "",
        *([f"TorchRL row skipped: {skip}"] if skip else []),
    )
    tmp = tempfile.mkdtemp(prefix="bench_script_imports_")
    scripts = {}
    for name, parts in (("aiocollect", AIOCOLLECT), ("torchrl", TORCHRL)):
        scripts[name] = os.path.join(tmp, f"train_{name}.py")
        with open(scripts[name], "w") as f:
            f.write(SCRIPT.format(steps=STEPS, **parts))
    floor: list[float] = []
    floor_td: list[float] = []  # the script imports tensordict itself: no collector can beat this
    results: dict[tuple[int, str], list[dict[str, Any]]] = {(n, r): [] for n in counts for r in rows}
    for _ in range(repeats):
        floor.append(h.time_command("import torch, gymnasium", args.timeout))
        floor_td.append(h.time_command("import torch, gymnasium, tensordict", args.timeout))
        for n in counts:
            for row in rows:
                cfg = {"benchmarks": os.path.dirname(os.path.abspath(__file__)), "row": row, "workers": n}
                os.environ["BENCH_SCRIPT_CFG"] = json.dumps(cfg)
                script = scripts["torchrl" if row == "TorchRL" else "aiocollect"]
                r = h.run_process([sys.executable, script], args.timeout, exit_grace=30.0)
                results[(n, row)].append(r)
                if "error" in r:
                    log(f"  {n} workers, {row}: ERROR {r['error']}\n{r.get('stderr', '')[-1500:]}")
                else:
                    log(
                        f"  {n} workers, {row}: script {r['script_s']:.2f} s, first batch {r['first_s']:.2f} s, "
                        f"worker USS {h.median(r['uss_mb']):.0f} MB, workers' CPU {r['cpu_s']:.2f} s"
                    )
    ref, ref_td = h.median(floor), h.median(floor_td)
    records = []
    for (n, row), rs in results.items():
        ok = [r for r in rs if "error" not in r]
        records.append(
            {
                "workers": n,
                "row": row,
                "script_s": h.median(r["script_s"] for r in ok),
                "first_s": h.median(r["first_s"] for r in ok),
                "uss_mb": h.median(h.median(r["uss_mb"]) for r in ok),
                "cpu_s": h.median(r["cpu_s"] for r in ok),
                "errors": len(rs) - len(ok),
            }
        )
    cols = [
        Col("workers", "{workers}"),
        Col("collector", "{row}", left=True),
        Col("script to first batch (s)", lambda r: h.fmt_s(r["script_s"])),
        Col("/ import floor", lambda r: h.fmt_x(h.div(r["script_s"], ref))),
        Col("/ floor with tensordict", lambda r: h.fmt_x(h.div(r["script_s"], ref_td))),
        Col("construction to first batch (s)", lambda r: h.fmt_s(r["first_s"])),
        Col("private MB per worker", lambda r: h.fmt_n(r["uss_mb"])),
        Col("workers' CPU to first batch (s)", lambda r: h.fmt_s(r["cpu_s"])),
        Col("failed samples", "{errors}"),
    ]
    log(f"\nimport floor (python -c 'import torch, gymnasium'): {ref:.2f} s, median of {len(floor)}")
    log(f"with tensordict (python -c 'import torch, gymnasium, tensordict'): {ref_td:.2f} s\n")
    for line in h.console_table(cols, records):
        log(line)
    run.footer()
    note = f"; medians of {repeats} fresh processes; floors {ref:.2f} and {ref_td:.2f} s"
    run.markdown(h.markdown_table(cols, records), note)
    run.write_json(args.json, floor_s=floor, floor_tensordict_s=floor_td, records=records)
    return 1 if any(r["errors"] for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
