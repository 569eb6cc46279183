"""`fork_forkserver`: a process's fork server forked from it, not started as a new interpreter.

Each case runs a script in a fresh interpreter (a process whose fork server is not running
yet, with one thread), through `run_script`, which fails on any process left behind: the
server must end with the process that forked it.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from _leaks import run_script

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(sys.platform != "linux", reason="the fork server, and /proc for the checks"),
]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

SCRIPT = textwrap.dedent(
    """
    import json, multiprocessing, os, select, sys, threading, types
    from multiprocessing import forkserver

    from aiocollect._workers._forked_server import fork_forkserver


    def report(conn):
        conn.send({
            "marker": "aiocollect_test_marker" in sys.modules, "preloaded": "colorsys" in sys.modules,
            "ppid": os.getppid(),
        })
        conn.close()


    if __name__ == "__main__":
        if sys.argv[1] == "thread":
            stop = threading.Event()
            threading.Thread(target=stop.wait).start()
            try:
                fork_forkserver()
            except RuntimeError as exc:
                print(json.dumps({"error": str(exc)}))
            finally:
                stop.set()
            sys.exit(0)
        # What a freshly started server would not have: a module made here, and a pipe.
        sys.modules["aiocollect_test_marker"] = types.ModuleType("aiocollect_test_marker")
        r, w = os.pipe()
        assert "colorsys" not in sys.modules
        # What the process would import later anyway goes in first; a missing module is skipped.
        first, again = fork_forkserver(["colorsys", "aiocollect_no_such_module"]), fork_forkserver()
        server = forkserver._forkserver._forkserver_pid
        ctx = multiprocessing.get_context("forkserver")
        here, there = ctx.Pipe()
        worker = ctx.Process(target=report, args=(there,))
        worker.start()
        there.close()
        got = here.recv()
        worker.join(30)
        # Our write end closed, the read end reads EOF unless the server kept a copy.
        os.close(w)
        eof = bool(select.select([r], [], [], 30)[0]) and os.read(r, 1) == b""
        with open(f"/proc/{server}/stat") as f:
            server_ppid = int(f.read().rpartition(")")[2].split()[1])
        print(json.dumps({
            "first": first, "again": again, "server": server, "server_ppid": server_ppid, "me": os.getpid(),
            "worker": got, "exitcode": worker.exitcode, "eof": eof,
        }))
    """
)


def run(tmp_path: Path, mode: str) -> dict[str, object]:
    script = tmp_path / "forked_server.py"
    script.write_text(SCRIPT)
    proc, leaked = run_script([sys.executable, str(script), mode], timeout=90, env=SCRIPT_ENV)
    assert proc.returncode == 0, proc.stderr
    assert not leaked, f"left processes behind: {leaked}"
    return json.loads(proc.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_workers_fork_from_a_copy_of_this_process_which_holds_none_of_its_descriptors(tmp_path: Path) -> None:
    out = run(tmp_path, "fork")
    assert out["first"] is True and out["again"] is False  # a server that runs is left as it is
    assert out["server_ppid"] == out["me"], "the server is this process's child"
    worker = out["worker"]
    assert isinstance(worker, dict)
    assert worker["ppid"] == out["server"] and out["exitcode"] == 0
    assert worker["marker"] is True, "the worker came from a fresh interpreter, not from a copy of this process"
    assert worker["preloaded"] is True
    assert out["eof"] is True, "the server holds a copy of a descriptor of this process"


def test_it_refuses_once_another_thread_runs(tmp_path: Path) -> None:
    out = run(tmp_path, "thread")
    assert "before any other thread starts" in str(out.get("error"))
