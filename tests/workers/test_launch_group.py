"""`end_group_but_self` finds every other live process of the group it leads, and only those.

Each case runs in a fresh interpreter (`run_script`), which leads a new session as a worker
does, so that what its children leave behind is its own and this test's process stays out
of it. `run_script` makes this process the reaper of orphans meanwhile, and lists any
process that outlives the script.
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from _leaks import run_script

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(sys.platform != "linux", reason="Linux process groups")]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

PRELUDE = """
    import os, select, signal
    from aiocollect._workers import _launch_group as lg

    assert lg.lead_new_group() and lg.leads_group(os.getpid())

    def ended_within(pidfd, deadline=10.0):
        # A pidfd turns readable when its process exits (reaped or not).
        return bool(select.select([pidfd], [], [], deadline)[0])
"""


def run(body: str) -> None:
    code = textwrap.dedent(PRELUDE) + textwrap.dedent(body)
    proc, leaked = run_script([sys.executable, "-c", code], timeout=30, env=SCRIPT_ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok", proc.stdout + proc.stderr
    assert leaked == []


def test_the_group_members_are_its_live_processes_only() -> None:
    run("""
        r, w = os.pipe()
        def child(then):
            pid = os.fork()
            if pid == 0:
                os.close(w)  # EOF once the script is gone, whatever happened to it
                then()
                os._exit(0)
            return pid
        member = child(lambda: os.read(r, 1))  # alive until the parent writes
        elsewhere = child(lambda: (os.setpgid(0, 0), os.read(r, 1)))  # same session, its own group
        zombie = child(lambda: None)
        os.waitid(os.P_PID, zombie, os.WEXITED | os.WNOWAIT)  # exited, not reaped
        os.setpgid(elsewhere, elsewhere)  # as the child does: whichever runs first, it is done
        me = os.getpid()
        assert os.getpgid(zombie) == me
        assert sorted(lg._group_members(me)) == sorted([me, member]), (lg._group_members(me), member)
        os.write(w, b"xx")
        for pid in (member, elsewhere, zombie):
            os.waitpid(pid, 0)
        print("ok")
    """)


def test_an_orphan_left_in_the_group_by_a_reaped_child_is_killed() -> None:
    # The child starts a grandchild (it stays in the group) and exits; once the child is
    # reaped this process has no child at all, yet its group still holds the grandchild.
    run("""
        r, w = os.pipe()
        child = os.fork()
        if child == 0:
            grandchild = os.fork()
            if grandchild == 0:
                while True:
                    signal.pause()
            os.write(w, str(grandchild).encode())
            os._exit(0)
        os.waitpid(child, 0)
        grandchild = int(os.read(r, 32))
        pidfd = os.pidfd_open(grandchild)
        assert os.getpgid(grandchild) == os.getpid() and lg._is_live_process(grandchild)
        lg.end_group_but_self()
        assert ended_within(pidfd), "the grandchild outlived end_group_but_self"
        print("ok")
    """)
