"""The benchmark scripts start, and the benchmark harness's pure functions compute what they say.

Nothing here times anything: each script only prints its ``--help`` (which imports it, and so its
harness and workloads), and the harness's statistics, pairing orders and tables are checked
against values worked out by hand.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p.name for p in BENCHMARKS.glob("bench_*.py"))
HELP_TIMEOUT_S = 120


def _load_harness() -> ModuleType:
    """``benchmarks/_harness`` under a private name, without putting benchmarks/ on sys.path
    (its modules' names would shadow nothing today, but the suite should not depend on that)."""
    pkg = BENCHMARKS / "_harness"
    spec = importlib.util.spec_from_file_location(
        "_bench_harness", pkg / "__init__.py", submodule_search_locations=[str(pkg)]
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its relative imports look the package up here
    spec.loader.exec_module(mod)
    return mod


h = _load_harness()


# --------------------------------------------------------------------------------------------
# The scripts
# --------------------------------------------------------------------------------------------


def test_every_script_is_listed() -> None:
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_script_help(script: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), "--help"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=HELP_TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith(f"usage: {script} "), proc.stdout[:200]


def test_node_scaling_rows_build_the_collector_they_name() -> None:
    """The "exec'd fork server" row patches a private helper of the node config: its patch must
    still fit the helper and still turn the node's own fork server off (it once raised a
    TypeError in every run, and the row vanished from the table)."""
    code = (
        "import bench_node_scaling as b, torch\n"
        "for kind in ('multi', 'multi-exec'):\n"
        "    c = b._make({'kind': kind, 'nodes': 2}, torch.nn.Linear(4, 2))\n"
        "    print(kind, c._dc.mc.transport_options['fork_server_in_nodes'])\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCHMARKS), str(ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=HELP_TIMEOUT_S
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["multi", "True", "multi-exec", "False"]


def test_checks_fail_the_exit_code_on_a_crashed_run_whatever_strict_says() -> None:
    ok = h.Checks()
    ok.add_runs({("a", 2): [{"fps": 1.0}], ("b", 2): [{"fps": 2.0}, {"fps": 3.0}]})
    assert ok.items == [("every run of every row returned a result", True, "3 of 3")]
    assert ok.exit_code(strict=False) == 0 and ok.exit_code(strict=True) == 0

    crashed = h.Checks()
    crashed.add_runs({("a", 2): [{"fps": 1.0}], ("b", 2): [{"error": "TypeError: boom"}, {"fps": 3.0}]})
    _, verdict, value = crashed.items[0]
    assert verdict is False and value == "1 of 3 failed; first: ('b', 2): TypeError: boom"
    assert crashed.exit_code(strict=False) == 1  # a crash is not noise

    missed = h.Checks()
    missed.add("a target", False, "0.8x")
    assert missed.exit_code(strict=False) == 0 and missed.exit_code(strict=True) == 1


# --------------------------------------------------------------------------------------------
# Statistics and ratios
# --------------------------------------------------------------------------------------------


def test_median_skips_missing_and_nan() -> None:
    assert h.median([3, 1, None, math.nan, 2]) == 2
    assert h.median([4, 1, 3, 2]) == 2.5
    assert math.isnan(h.median([]))
    assert math.isnan(h.median([None, math.inf]))


def test_medians_per_key() -> None:
    records = [{"a": 1.0, "b": None}, {"a": 3.0}, {"a": 2.0, "b": 4.0}]
    out = h.medians(records, ("a", "b", "c"))
    assert list(out) == ["a", "b", "c"]
    assert out["a"] == 2.0 and out["b"] == 4.0 and math.isnan(out["c"])


def test_spread_and_percentile() -> None:
    assert h.spread([90.0, 100.0, 110.0]) == pytest.approx(0.2)
    assert h.spread([5.0]) == 0.0
    assert h.percentile([1, 2, 3, 4], 50) == 2.5
    assert h.percentile([1, 2, 3, 4], 100) == 4
    assert h.percentile([10, 20], 25) == 12.5


def test_div_is_nan_without_a_reference() -> None:
    assert h.div(3.0, 1.5) == 2.0
    assert math.isnan(h.div(1.0, None))
    assert math.isnan(h.div(1.0, 0.0))
    assert math.isnan(h.div(1.0, math.nan))
    assert math.isnan(h.div(None, 2.0))


def test_pair_ratios() -> None:
    assert h.pair_ratios([2.0, 3.0], [1.0, 6.0]) == [2.0, 0.5]
    with pytest.raises(ValueError):
        h.pair_ratios([1.0], [1.0, 2.0])


def test_ratio_summary() -> None:
    assert h.ratio_summary([4.0, 1.0, 3.0, 2.0]) == {"median": 2.5, "p25": 2.0, "p75": 4.0, "min": 1.0, "max": 4.0}


def test_find_reference_row() -> None:
    rows = [{"kind": "aio", "n": 2}, {"kind": "bare", "n": 2}, {"kind": "bare", "n": 8}]
    assert h.find(rows, kind="bare", n=8) is rows[2]
    assert h.find(rows, kind="bare", n=None) is rows[1]  # None matches anything
    assert h.find(rows, kind="torchrl") is None


# --------------------------------------------------------------------------------------------
# Pairing and ordering
# --------------------------------------------------------------------------------------------


def test_abba_order() -> None:
    assert list(h.abba_order(3)) == [(0, 0), (0, 1), (1, 1), (1, 0), (2, 0), (2, 1)]
    assert list(h.abba_order(0)) == []


def test_abba_calls_and_results() -> None:
    calls: list[str] = []

    def side(name: str, value: float) -> Any:
        def f() -> float:
            calls.append(name)
            return value + len(calls)

        return f

    a, b = h.abba(side("a", 0.0), side("b", 100.0), 2)
    assert calls == ["a", "b", "b", "a"]
    assert a == [1.0, 4.0] and b == [102.0, 103.0]


def test_round_robin() -> None:
    assert list(h.round_robin(["x", "y"], 2)) == [(0, "x"), (0, "y"), (1, "x"), (1, "y")]


def test_calibrate_calls() -> None:
    seen: list[int] = []

    def runner(n: int) -> float:  # 10 ms per call
        seen.append(n)
        return n * 0.01

    # 1 call: 10 ms < 30 ms; 4 calls: 40 ms, enough; 0.1 s / 10 ms per call = 10 calls.
    assert h.calibrate_calls(runner, 0.1) == 10
    assert seen == [1, 4]
    assert h.calibrate_calls(runner, 0.001) == 3  # never fewer than min_calls


def test_fresh_rounds_order(monkeypatch: pytest.MonkeyPatch) -> None:
    procs = sys.modules["_bench_harness._procs"]
    events: list[Any] = []

    def fake_run_child(module: str, cfg: dict[str, Any], timeout: float, exit_grace: float) -> dict[str, Any]:
        events.append(("child", module, cfg["key"], cfg["rep"], timeout, exit_grace))
        return {"fps": cfg["rep"]}

    monkeypatch.setattr(procs, "run_child", fake_run_child)
    out = h.fresh_rounds(
        "bench_x",
        ["a", "b"],
        2,
        lambda k, rep: {"key": k, "rep": rep},
        9.0,
        rounds=3,
        before_round=lambda rep: events.append(("ref", rep)),
        on_result=lambda k, rep, cfg, r: events.append(("done", k, rep)),
    )
    assert out == {"a": [{"fps": 0}, {"fps": 1}], "b": [{"fps": 0}, {"fps": 1}]}
    assert events == [
        ("ref", 0),
        ("child", "bench_x", "a", 0, 9.0, 15.0),
        ("done", "a", 0),
        ("child", "bench_x", "b", 0, 9.0, 15.0),
        ("done", "b", 0),
        ("ref", 1),
        ("child", "bench_x", "a", 1, 9.0, 15.0),
        ("done", "a", 1),
        ("child", "bench_x", "b", 1, 9.0, 15.0),
        ("done", "b", 1),
        ("ref", 2),  # the reference is sampled in a third round; the rows ran twice
    ]


# --------------------------------------------------------------------------------------------
# Formatting and tables
# --------------------------------------------------------------------------------------------


def test_formatters() -> None:
    assert h.fmt_x(1.234) == "1.23x"
    assert h.fmt_x(math.nan) == "n/a"
    assert h.fmt_n(12345.6, sep=True) == "12,346"
    assert h.fmt_n(1.25, 1) == "1.2"
    assert h.fmt_s(0.1234) == "0.123" and h.fmt_s(2.345) == "2.35"
    assert h.fmt_ms(0.01234) == "12.3"
    assert h.fmt_pct(0.456) == "46%"


COLS = [
    h.Col("row", "{row}", 6, left=True),
    h.Col("frames/s", "{fps:.0f}"),
    h.Col("x bare", h.ratio("vs_bare", "-")),
]
RECORDS = [
    {"row": "bare", "fps": 1000.4, "vs_bare": 1.0},
    {"row": "aiocollect", "fps": 950.0, "vs_bare": 0.9496},
    {"row": "gone", "fps": math.nan, "vs_bare": math.nan},
]


def test_console_table() -> None:
    lines = h.console_table(COLS, [*RECORDS, ["broken", "ERROR: a long message"]], indent="  ")
    assert lines == [
        "  row        frames/s x bare",
        "  --------------------------",
        "  bare           1000  1.00x",
        "  aiocollect      950  0.95x",
        "  gone            nan      -",
        "  broken     ERROR: a long message",
    ]


def test_markdown_table() -> None:
    assert h.markdown_table(COLS, [*RECORDS[:2], ["short"]]) == [
        "| row | frames/s | x bare |",
        "| --- | ---: | ---: |",
        "| bare | 1000 | 1.00x |",
        "| aiocollect | 950 | 0.95x |",
        "| short |  |  |",
    ]


def test_gap_line_and_columns() -> None:
    v = {"p50_ms": 1.1, "p99_ms": 2.25, "max_ms": 10.0, "ticks": 42}
    assert h.gap_line("idle", v, 6, inside=", x", after="!") == (
        "  idle   p50   1.10 ms  p99   2.25 ms  max   10.00 ms  (42 ticks, x)!"
    )
    cols = h.gap_columns("loop")
    assert [c.head for c in cols] == ["loop", "p50 gap (ms)", "p99 gap (ms)", "max gap (ms)"]
    assert h.markdown_table(cols, [{"label": "idle", **v}])[2] == "| idle | 1.10 | 2.25 | 10.00 |"
