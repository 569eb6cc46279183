"""The fork server starts at the lookup of a forking collector; workers take the parent's environment.

Each test runs a fresh interpreter (`run_script`): the fork server is per process, and this
one's was started long ago by earlier tests.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from _leaks import run_script

pytestmark = [pytest.mark.timeout(180), pytest.mark.skipif(sys.platform != "linux", reason="fork server")]
ROOT = Path(__file__).resolve().parents[2]
SCRIPT_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

LOOKUP = textwrap.dedent(
    """
    import json, multiprocessing, sys
    from multiprocessing import forkserver

    class SeesTensordict:  # records whether the fork server runs when tensordict is imported
        server_then = "tensordict never imported"

        def find_spec(self, name, path=None, target=None):
            if name == "tensordict" and SeesTensordict.server_then == "tensordict never imported":
                SeesTensordict.server_then = forkserver._forkserver._forkserver_pid
            return None

    sys.meta_path.insert(0, SeesTensordict())
    import aiocollect

    getattr(aiocollect, sys.argv[1])
    print(json.dumps({"at_tensordict": SeesTensordict.server_then,
                      "after": forkserver._forkserver._forkserver_pid,
                      "start_method": multiprocessing.get_start_method(allow_none=True)}))
    """
)


def lookup(tmp_path: Path, name: str) -> dict[str, object]:
    script = tmp_path / "lookup.py"
    script.write_text(LOOKUP)
    proc, leaked = run_script([sys.executable, str(script), name], timeout=120, env=SCRIPT_ENV)
    assert proc.returncode == 0, proc.stderr
    assert not leaked, leaked
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", ["MultiSyncDataCollector", "MultiaSyncDataCollector", "AsyncCollector"])
def test_looking_up_a_forking_collector_starts_the_fork_server_before_tensordict(tmp_path: Path, name: str) -> None:
    seen = lookup(tmp_path, name)
    assert isinstance(seen["at_tensordict"], int)  # running while the parent imports tensordict
    assert seen["after"] == seen["at_tensordict"]
    assert seen["start_method"] is None  # the user may still choose one


@pytest.mark.parametrize("name", ["SyncDataCollector", "Collector", "ReplayBuffer", "DistributedCollector"])
def test_other_lookups_start_no_process(tmp_path: Path, name: str) -> None:
    assert lookup(tmp_path, name) == {"at_tensordict": None, "after": None, "start_method": None}


def test_a_failing_head_start_never_breaks_the_lookup(tmp_path: Path) -> None:
    script = tmp_path / "failing.py"
    script.write_text(
        "import aiocollect._workers._prestart as p\n"
        "def fail():\n"
        "    raise OSError('no fork server here')\n"
        "p.prestart_forkserver = fail\n"
        "import aiocollect\n"
        "print(aiocollect.MultiSyncDataCollector.__name__)\n"
    )
    proc, leaked = run_script([sys.executable, str(script)], timeout=120, env=SCRIPT_ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "MultiSyncCollector\n"
    assert not leaked, leaked


IN_A_CHILD = textwrap.dedent(
    """
    import multiprocessing
    from multiprocessing import forkserver

    def look_up(queue):
        import aiocollect

        aiocollect.MultiSyncDataCollector
        queue.put(forkserver._forkserver._forkserver_pid)

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")
        queue = ctx.Queue()
        child = ctx.Process(target=look_up, args=(queue,))
        child.start()
        print(queue.get(timeout=60))
        child.join(60)
        print(child.exitcode)
    """
)


def test_a_process_started_by_multiprocessing_starts_no_fork_server_of_its_own(tmp_path: Path) -> None:
    # A spawned worker re-imports its parent's main module, whose imports look collectors up.
    script = tmp_path / "in_a_child.py"
    script.write_text(IN_A_CHILD)
    proc, leaked = run_script([sys.executable, str(script)], timeout=120, env=SCRIPT_ENV)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["None", "0"]
    assert not leaked, leaked


ENVIRON = textwrap.dedent(
    """
    import json, os, sys
    from functools import partial
    from aiocollect.testing import CountingEnv

    def env_that_reports(path):
        with open(path, "w") as f:
            json.dump({k: os.environ.get(k) for k in ("AIOC_KEPT", "AIOC_CHANGED", "AIOC_DROPPED", "AIOC_NEW")}, f)
        return CountingEnv(1)

    if __name__ == "__main__":
        os.environ.update(AIOC_KEPT="kept", AIOC_CHANGED="old", AIOC_DROPPED="dropped")
        from aiocollect import DistributedDataCollector, MultiSyncDataCollector  # starts the fork server

        os.environ.update(AIOC_CHANGED="new", AIOC_NEW="new")
        del os.environ["AIOC_DROPPED"]
        out = sys.argv[1]
        with MultiSyncDataCollector([partial(env_that_reports, f"{out}/worker")], None,
                                    frames_per_batch=4, total_frames=4) as c:
            assert sum(b.numel() for b in c) == 4
        with DistributedDataCollector([partial(env_that_reports, f"{out}/node")], None, frames_per_batch=4,
                                      total_frames=4, launcher="mp") as c:
            assert sum(b.numel() for b in c) == 4
        print("ok")
    """
)


def test_workers_and_nodes_take_the_parents_environment_of_when_they_start(tmp_path: Path) -> None:
    script = tmp_path / "environ.py"
    script.write_text(ENVIRON)
    env = {**SCRIPT_ENV, "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    proc, leaked = run_script([sys.executable, str(script), str(tmp_path)], timeout=150, env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"
    expected = {"AIOC_KEPT": "kept", "AIOC_CHANGED": "new", "AIOC_DROPPED": None, "AIOC_NEW": "new"}
    for who in ("worker", "node"):
        assert json.loads((tmp_path / who).read_text()) == expected, who
    assert not leaked, leaked


NODE_PRELOAD = textwrap.dedent(
    """
    import json, os, sys
    from multiprocessing.connection import wait
    from aiocollect._workers._launch import MpLauncher
    from aiocollect._workers._prestart import node_preload

    WATCHED = ("tensordict", "torch.distributed", "aiocollect._dist._node", "aiocollect._workers._distributed_node")

    def probe(out, fifo):  # a node's main: what it finds imported at its start
        with open(out, "w") as f:
            json.dump(sorted(m for m in WATCHED if m in sys.modules), f)
        with open(fifo, "rb") as f:  # blocks until the parent opens the other end
            f.read()

    if __name__ == "__main__":
        worker_main, out, fifo = sys.argv[1:]
        os.mkfifo(fifo)
        modules = ("torch.distributed", "aiocollect._workers._distributed_node")
        launcher = MpLauncher("forkserver", probe, node_preload(modules, worker_main))
        launcher.launch(1, (out, fifo))
        running = launcher.release_ended(1)  # the node waits on the fifo: still running
        with open(fifo, "wb"):
            pass
        assert wait([launcher.sentinel(1)], 60)
        print(json.dumps([running, launcher.release_ended(1), launcher.exitcode(1), launcher.sentinel(1)]))
    """
)


@pytest.mark.parametrize(
    ("worker_main", "expected"),
    [
        (
            "aiocollect._dist._node:run_node",
            ["aiocollect._dist._node", "aiocollect._workers._distributed_node", "tensordict", "torch.distributed"],
        ),
        # The plain worker loop never needs tensordict: the fork server does not wait for it.
        ("aiocollect._workers._loop:run_worker", ["aiocollect._workers._distributed_node", "torch.distributed"]),
    ],
)
def test_local_nodes_start_with_what_they_run_already_imported_and_are_released_at_once(
    tmp_path: Path, worker_main: str, expected: list[str]
) -> None:
    script = tmp_path / "node_preload.py"
    script.write_text(NODE_PRELOAD)
    args = [sys.executable, str(script), worker_main, str(tmp_path / "seen"), str(tmp_path / "fifo")]
    proc, leaked = run_script(args, timeout=150, env=SCRIPT_ENV)
    assert proc.returncode == 0, proc.stderr
    # Not released while running; released without blocking once ended: code known, sentinel gone.
    assert json.loads(proc.stdout) == [False, True, 0, None]
    assert json.loads((tmp_path / "seen").read_text()) == expected
    assert not leaked, leaked


DISTRIBUTED_PRELOAD = textwrap.dedent(
    """
    import json
    from multiprocessing import forkserver
    from aiocollect import DistributedDataCollector
    from aiocollect.testing import CountingEnv

    if __name__ == "__main__":
        with DistributedDataCollector([CountingEnv, CountingEnv], None, frames_per_batch=4, total_frames=4,
                                      launcher="mp") as c:
            assert sum(b.numel() for b in c) == 4
        print(json.dumps(forkserver._forkserver._preload_modules))
    """
)


def test_a_distributed_collector_starts_its_fork_server_with_what_its_nodes_import(tmp_path: Path) -> None:
    script = tmp_path / "distributed_preload.py"
    script.write_text(DISTRIBUTED_PRELOAD)
    env = {**SCRIPT_ENV, "MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo"}
    proc, leaked = run_script([sys.executable, str(script)], timeout=150, env=env)
    assert proc.returncode == 0, proc.stderr
    preload = json.loads(proc.stdout)
    assert {"tensordict", "aiocollect._dist._node", "torch.distributed"} <= set(preload)
    assert preload[-1] == "aiocollect._workers._forkserver"  # still last: it freezes what the others loaded
    assert not leaked, leaked
