"""CI's time budget: the extra test passes run when they fit, and a slow day skips them by name.

``.ci/run`` must end inside CI's 90 minutes. Its extra passes (other Pythons, the dependency
floors) each estimate their time from the README test command's and run only if that fits
in what is left of the budget. These tests run the script's own ``budgeted_phase`` and the
passes' own shares, read from ``.ci/run``, on the timings of an ordinary day and of the slow
day that made the budget necessary (2026-12-01).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

CI_RUN = Path(__file__).resolve().parents[1] / ".ci" / "run"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="CI's script is a bash script")


def _budget_code() -> str:
    """``.ci/run``'s budget setting and its ``budgeted_phase`` function, as the script has them."""
    text = CI_RUN.read_text()
    match = re.search(r"^CI_BUDGET_S=.*?^}\n", text, re.M | re.S)
    assert match, "no CI_BUDGET_S setting followed by budgeted_phase() in .ci/run"
    return match.group(0)


def _passes() -> list[tuple[str, str]]:
    """Each guarded pass's name and share of the README test command's time, in the script's order."""
    found = re.findall(r'^if budgeted_phase "([^"]+)" ([0-9.]+); then$', CI_RUN.read_text(), re.M)
    assert len(found) == 3, f"expected the three extra passes to be guarded, found {found}"
    return found


def _decide(test_took: int, elapsed: int, budget: int | None = None) -> tuple[list[str], list[str], str]:
    """Run the guards of every pass with the given timings: (passes run, skips listed, output)."""
    checks = "\n".join(f'if budgeted_phase "{name}" {share}; then echo "RUN {name}"; fi' for name, share in _passes())
    script = f"""
set -euo pipefail
T_START=$((SECONDS - {elapsed}))
SKIPPED=()
TEST_TOOK={test_took}
phase_end() {{ echo "PHASE_END"; }}
phase() {{ echo "PHASE $1"; }}
{_budget_code()}
{checks}
for t in "${{SKIPPED[@]}}"; do echo "SKIP $t"; done
"""
    env = {k: v for k, v in os.environ.items() if k != "CI_BUDGET_S"}  # CI's own setting must not leak in
    if budget is not None:
        env["CI_BUDGET_S"] = str(budget)
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env=env, timeout=30, check=True)
    assert done.stderr == "", done.stderr
    out = done.stdout
    assert out.count("PHASE_END") == len(_passes()), "each check first ends the phase before it"
    ran = [line[4:] for line in out.splitlines() if line.startswith("RUN ")]
    assert [line[6:] for line in out.splitlines() if line.startswith("PHASE ")] == ran, "a pass that runs is a phase"
    skipped = [line[5:] for line in out.splitlines() if line.startswith("SKIP ")]
    return ran, skipped, out


def test_on_an_ordinary_day_every_pass_runs() -> None:
    # 2026-11-29's rehearsal: the README test command took 975 s, and about 1,300 s had passed
    # when the first extra pass began.
    ran, skipped, _ = _decide(test_took=975, elapsed=1300)
    assert ran == [name for name, _ in _passes()]
    assert skipped == []


def test_on_a_slow_day_the_passes_that_do_not_fit_are_skipped_by_name() -> None:
    # 2026-12-01: the README test command took 2679 s; the first extra pass would begin at
    # about 3,100 s. Python 3.13's pass (about 2,700 s with the margin) and 3.10's (about
    # 2,200 s) no longer fit in 4,800 s; the floors' (about 1,100 s) still does.
    ran, skipped, out = _decide(test_took=2679, elapsed=3100)
    assert ran == ["tests at the dependency floors"]
    assert [s.split(" (")[0] for s in skipped] == ["tests on Python 3.13, tensordict 0.15", "tests on Python 3.10"]
    assert "=== SKIPPED: tests on Python 3.13, tensordict 0.15: it would take about 2679s" in out
    assert "needed ~2679s, 1700s left" in skipped[0]


def test_the_time_already_spent_counts() -> None:
    # The same README test command (1,600 s) with 2,000 s spent: every pass fits. With
    # 3,600 s spent (the 3.13 pass having run, say), 3.13's (1,600 s with the margin) and
    # 3.10's (1,300 s) no longer do; the floors' (640 s) still does.
    ran, _, _ = _decide(test_took=1600, elapsed=2000)
    assert ran == [name for name, _ in _passes()]
    ran, _, _ = _decide(test_took=1600, elapsed=3600)
    assert ran == ["tests at the dependency floors"]


def test_ci_budget_s_sets_the_budget() -> None:
    ran, skipped, _ = _decide(test_took=975, elapsed=1300, budget=1500)
    assert ran == []
    assert len(skipped) == 3
    ran, _, _ = _decide(test_took=2679, elapsed=3100, budget=9000)
    assert ran == [name for name, _ in _passes()]
