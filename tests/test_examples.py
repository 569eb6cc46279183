"""Smoke-run every script in ``examples/`` at tiny sizes, as a user would run it.

Each example runs in a fresh interpreter (``python examples/<name>.py <tiny args>``) and must
exit with code 0, print its final summary (``... after N frames ...`` with N the frame budget
given on the command line, then ``final mean return ...``), and leave no process behind. The
examples are discovered with a glob: a new example needs an entry in `TINY_ARGS`, and the test
fails with a clear message until it has one.

While an example runs, this process is made a child subreaper (Linux), so a worker process
orphaned by the example is reparented here instead of to init, and shows up in
``psutil.Process().children(recursive=True)`` after the run. The one process allowed to outlive
an example is multiprocessing's resource tracker (started by every ``spawn``; it exits on its
own when the example's end of its pipe closes, i.e. just after the example exits). It is often
a zombie by the time it is seen, when its command line can no longer be read, so a thread
records the command line of every descendant while the example runs.
"""

from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import threading
from pathlib import Path

import psutil
import pytest

try:  # works whether or not tests/ is a package
    from ._leaks import orphans_reparented_here
except ImportError:
    from _leaks import orphans_reparented_here

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))

#: Command-line arguments that make each example finish in seconds (CI sizes). Every example
#: takes ``--total-frames``; it must print "after <total-frames> frames" when it stops.
TINY_ARGS: dict[str, list[str]] = {
    "ppo_cartpole.py": ["--total-frames", "1024", "--num-envs", "2", "--frames-per-batch", "256", "--update-epochs", "1"],
    "dqn_multiasync.py": ["--total-frames", "2048", "--learning-starts", "512", "--eval-frequency", "1024"],
    "distributed_train.py": ["--total-frames", "1024", "--num-envs", "2", "--frames-per-batch", "256", "--update-epochs", "1"],
    "ppo_multisync.py": ["--total-frames", "1024", "--num-envs", "2", "--frames-per-batch", "256", "--update-epochs", "1"],
    "ray_train.py": ["--total-frames", "1024", "--num-envs", "2", "--frames-per-batch", "256", "--update-epochs", "1"],
    "torchrl_ppo.py": ["--total-frames", "400", "--frames-per-batch", "200", "--num-epochs", "1"],
    "tool_use_async.py": ["--total-frames", "1024", "--num-envs", "64", "--frames-per-batch", "512"],
}

#: Examples that need an optional dependency (the module they import), skipped without it.
NEEDS: dict[str, str] = {"torchrl_ppo.py": "torchrl"}

#: Seconds one example may take (spawned workers alone need ~5 s to start on 2 slow cores).
RUN_TIMEOUT = 100

#: Descendants an example may leave behind (see the module docstring).
ALLOWED_SURVIVORS = re.compile(r"multiprocessing\.resource_tracker")


class DescendantRecorder:
    """Records the command line of every descendant process, sampled in a thread."""

    def __init__(self, interval: float = 0.02) -> None:
        self.cmdlines: dict[tuple[int, float], str] = {}
        self._interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="descendant recorder", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def sample(self) -> None:
        for key, p in _children().items():
            try:  # re-read each time: a child is briefly a copy of its parent before exec
                self.cmdlines[key] = " ".join(p.cmdline())
            except psutil.Error:
                pass  # gone, or a zombie: keep the last command line read

    def __enter__(self) -> DescendantRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _children() -> dict[tuple[int, float], psutil.Process]:
    out = {}
    for p in psutil.Process().children(recursive=True):
        try:
            out[(p.pid, p.create_time())] = p
        except psutil.NoSuchProcess:
            pass
    return out


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
    before = _children()
    with orphans_reparented_here(), DescendantRecorder() as recorder:
        try:
            proc = subprocess.run(
                [sys.executable, str(path), *args], check=False, capture_output=True, text=True,
                timeout=RUN_TIMEOUT, cwd=ROOT, env=env,
            )  # fmt: skip
        finally:
            recorder.sample()  # read what it can while the survivors still have a command line
            survivors = {key: p for key, p in _children().items() if key not in before}
            # Helpers that exit right after the script (the multiprocessing resource tracker,
            # a worker reading its parent's EOF) get a moment to go; whatever is left is a leak.
            _, alive = psutil.wait_procs(list(survivors.values()), timeout=5)
            survivors = {key: p for key, p in survivors.items() if p in alive}
            for p in survivors.values():  # clean up (kill and reap) before reporting
                try:
                    p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(list(survivors.values()), timeout=5)
    leaked = [
        f"pid {key[0]}: {recorder.cmdlines.get(key, '(command line unknown)')[:160]}"
        for key in survivors
        if not ALLOWED_SURVIVORS.search(recorder.cmdlines.get(key, ""))
    ]

    report = f"exit code {proc.returncode}\n--- stdout ---\n{proc.stdout}\n--- stderr (tail) ---\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, report
    assert "Warning" not in proc.stderr, report  # an example's own settings must not warn
    lines = proc.stdout.strip().splitlines()
    assert len(lines) >= 2, report
    assert re.search(rf"\bafter {total_frames} frames\b", lines[-2]), report
    assert lines[-1].startswith("final mean return"), report
    assert not leaked, f"examples/{path.name} left processes behind:\n  " + "\n  ".join(leaked)


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
