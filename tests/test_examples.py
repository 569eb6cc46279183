"""Smoke-run every script in ``examples/`` at tiny sizes, as a user would run it.

Each example runs in a fresh interpreter (``python examples/<name>.py <tiny args>``) and must
exit with code 0, print its final summary (``... after N frames ...`` with N the frame budget
given on the command line, then ``final mean return ...``), and leave no process behind. The
examples are discovered with a glob: a new example needs an entry in `TINY_ARGS`, and the test
fails with a clear message until it has one.

Examples run through ``_leaks.run_script``: this process is their child subreaper meanwhile, so
a worker orphaned by an example is seen (and reported) instead of vanishing into init; only
multiprocessing's resource tracker may outlive an example, for the moment it takes to notice.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

try:  # works whether or not tests/ is a package
    from ._leaks import run_script
except ImportError:
    from _leaks import run_script

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

#: Command-line arguments that make each example finish in seconds (CI sizes). Every example
#: takes ``--total-frames``; it must print "after <total-frames> frames" when it stops.
TINY_ARGS: dict[str, list[str]] = {
    "ppo_cartpole.py": [
        "--total-frames",
        "1024",
        "--num-envs",
        "2",
        "--frames-per-batch",
        "256",
        "--update-epochs",
        "1",
    ],
    "dqn_multiasync.py": ["--total-frames", "2048", "--learning-starts", "512", "--eval-frequency", "1024"],
    "distributed_train.py": [
        "--total-frames",
        "1024",
        "--num-envs",
        "2",
        "--frames-per-batch",
        "256",
        "--update-epochs",
        "1",
    ],
    "ppo_multisync.py": [
        "--total-frames",
        "1024",
        "--num-envs",
        "2",
        "--frames-per-batch",
        "256",
        "--update-epochs",
        "1",
    ],
    "ray_train.py": ["--total-frames", "1024", "--num-envs", "2", "--frames-per-batch", "256", "--update-epochs", "1"],
    "torchrl_ppo.py": ["--total-frames", "400", "--frames-per-batch", "200", "--num-epochs", "1"],
    "tool_use_async.py": ["--total-frames", "1024", "--num-envs", "64", "--frames-per-batch", "512"],
    "agent_central.py": ["--total-frames", "512", "--num-envs", "16", "--frames-per-batch", "256"],
}

#: For each example, a frame budget smaller than the warm-up it needs before it can train (DQN's
#: learning_starts, one whole PPO batch), all else at its defaults. Each run must end at once
#: with an argument error, instead of waiting for frames that will never come (DQN with
#: ``--total-frames 2048`` once sat silent for ten minutes: its learning_starts is 10,000).
BELOW_WARM_UP: dict[str, list[str]] = {
    "dqn_multiasync.py": ["--total-frames", "2048"],  # learning_starts: 10,000
    "ppo_cartpole.py": ["--total-frames", "512"],  # frames_per_batch: 1,024
    "ppo_multisync.py": ["--total-frames", "512"],
    "distributed_train.py": ["--total-frames", "512"],
    "ray_train.py": ["--total-frames", "512"],
    "tool_use_async.py": ["--total-frames", "1024"],  # frames_per_batch: 4,096
    "agent_central.py": ["--total-frames", "1024"],  # frames_per_batch: 2,048
    "torchrl_ppo.py": ["--total-frames", "500"],  # frames_per_batch: 1,000
}

#: Seconds a refused command line may take: the interpreter and the example's imports only.
REFUSAL_TIMEOUT = 30

#: Examples that need an optional dependency (the module they import), skipped without it.
NEEDS: dict[str, str] = {"torchrl_ppo.py": "torchrl"}

#: Seconds one example may take (spawned workers alone need ~5 s to start on 2 slow cores).
RUN_TIMEOUT = 100


def test_every_example_has_tiny_args() -> None:
    names = {p.name for p in EXAMPLES}
    assert "ppo_cartpole.py" in names and "ppo_multisync.py" in names, f"examples not found in {ROOT / 'examples'}"
    assert not set(TINY_ARGS) - names, f"TINY_ARGS lists examples that do not exist: {sorted(set(TINY_ARGS) - names)}"


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_runs_at_tiny_size(path: Path) -> None:
    if path.name not in TINY_ARGS:
        pytest.fail(
            f"examples/{path.name} has no entry in TINY_ARGS of {Path(__file__).name}; add the command-line "
            "arguments that make it finish in a few seconds (e.g. a tiny --total-frames)",
            pytrace=False,
        )
    if path.name in NEEDS:
        pytest.importorskip(NEEDS[path.name])
    args = TINY_ARGS[path.name]
    total_frames = int(args[args.index("--total-frames") + 1])
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc, leaked = run_script([sys.executable, str(path), *args], timeout=RUN_TIMEOUT, cwd=ROOT, env=env)

    report = f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr (tail) ---\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, report
    assert "Warning" not in proc.stderr, report  # an example's own settings must not warn
    lines = proc.stdout.strip().splitlines()
    assert len(lines) >= 2, report
    assert re.search(rf"\bafter {total_frames} frames\b", lines[-2]), report
    assert lines[-1].startswith("final mean return"), report
    assert not leaked, f"examples/{path.name} left processes behind:\n  " + "\n  ".join(leaked)


@pytest.mark.timeout(REFUSAL_TIMEOUT + 30)
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_with_a_budget_below_its_warm_up_ends_at_once_with_an_argument_error(path: Path) -> None:
    if path.name not in BELOW_WARM_UP:
        pytest.fail(
            f"examples/{path.name} has no entry in BELOW_WARM_UP of {Path(__file__).name}; add a --total-frames "
            "smaller than what the example collects before its first update",
            pytrace=False,
        )
    if path.name in NEEDS:
        pytest.importorskip(NEEDS[path.name])
    args = BELOW_WARM_UP[path.name]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    start = time.monotonic()
    proc, leaked = run_script([sys.executable, str(path), *args], timeout=REFUSAL_TIMEOUT, cwd=ROOT, env=env)
    took = time.monotonic() - start
    report = (
        f"exit code {proc.returncode} after {took:.1f}s\n--- stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"
    )
    # argparse's exit code for a refused command line: the check ran before anything started.
    assert proc.returncode == 2, report
    error = proc.stderr.strip().splitlines()[-1]
    assert "error: " in error and f"--total-frames ({args[1]})" in error, report  # names the value it refused
    assert "raise --total-frames" in error, report  # the message says how to fix it
    assert not proc.stdout, report  # nothing ran: no progress bar, no summary
    assert not leaked, f"examples/{path.name} left processes behind:\n  " + "\n  ".join(leaked)


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_defaults_pass_its_own_argument_checks(path: Path) -> None:
    if path.name in NEEDS:
        pytest.importorskip(NEEDS[path.name])
    module = runpy.run_path(str(path), run_name="example_under_test")
    assert module["check_args"](module["Args"]()) == []


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_defaults_spend_the_budget_in_whole_batches(path: Path) -> None:
    # The examples' defaults are what a newcomer runs first: they must not warn that the
    # last batch overshoots total_frames.
    if path.name in NEEDS:
        pytest.importorskip(NEEDS[path.name])
    args = runpy.run_path(str(path), run_name="example_under_test")["Args"]()
    assert args.total_frames % args.frames_per_batch == 0, (args.total_frames, args.frames_per_batch)


def readme_snippets() -> list[str]:
    """The README's self-contained Python snippets (those that start with an import)."""
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [b for b in blocks if b.startswith(("import ", "from "))]


@pytest.mark.timeout(RUN_TIMEOUT + 30)
@pytest.mark.parametrize("snippet", readme_snippets(), ids=lambda b: b.splitlines()[-1][:40])
def test_readme_snippet_runs_and_prints_something_to_learn_from(snippet: str) -> None:
    proc = subprocess.run([sys.executable, "-W", "error", "-c", snippet], capture_output=True, text=True,
                          timeout=RUN_TIMEOUT, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(set(lines)) == len(lines), proc.stdout  # no line repeated verbatim (it printed tensor(256.) x8)
