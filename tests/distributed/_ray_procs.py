"""Ray-aware process snapshots for the Ray tests.

Ray runs system processes (raylet, GCS, agents) and keeps a pool of idle worker processes
(``ray::IDLE``) that it starts and retires on its own schedule. They belong to the Ray
instance, not to the test that happened to be running; anything else new in the process
tree (an actor that outlived its collector, the processes its collector started) is.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from dataclasses import replace

import psutil
import pytest
from _leaks import Snapshot, find_leaks, take_snapshot, wait_for_no_leaks

__all__ = ["local_ray", "no_leaks", "ray_processes", "ray_snapshot"]

_RAY_OWN = re.compile(
    r"^ray::IDLE|default_worker\.py|raylet|gcs_server|ray/dashboard|log_monitor|ray_client_server|"
    r"runtime_env/agent|ray/_private|ray::(?!NodeHost|_run_node)"
)


def _tree() -> list[psutil.Process]:
    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())
    except psutil.Error:
        return ""


def ray_processes() -> set[int]:
    """Pids of every Ray process in this process's tree (Ray's own and its actors')."""
    return {p.pid for p in _tree() if "ray" in _cmdline(p)}


def ray_snapshot() -> Snapshot:
    """`take_snapshot`, without Ray's own processes and idle workers."""
    snap = take_snapshot()
    keep = {key: cmd for key, cmd in snap.children.items() if not _RAY_OWN.search(cmd)}
    return replace(snap, children=keep)


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    """A local Ray (``num_cpus=2``, on 127.0.0.1) for the module's collectors to join; it must stay up."""
    import ray

    before = ray_processes()
    # Actors and tasks unpickle the test modules' env factories by reference: they must
    # import them (as a user's cluster must import the user's modules).
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")])
    ray.init(runtime_env={"env_vars": {"PYTHONPATH": path}},
             num_cpus=2, _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False)  # fmt: skip
    try:
        yield
    finally:
        ray.shutdown()
    deadline = time.monotonic() + 10
    while ray_processes() - before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not ray_processes() - before, f"Ray processes outlived ray.shutdown(): {ray_processes() - before}"


@pytest.fixture(autouse=True)
def no_leaks() -> Iterator[None]:
    """The leak check of the Ray modules: Ray's idle pool and system processes are not the test's."""
    before = ray_snapshot()
    yield
    after = wait_for_no_leaks(before, timeout=10.0, snapshot=ray_snapshot, fd_slack=8)
    problems = find_leaks(before, after, fd_slack=8)
    if problems:
        pytest.fail("resources leaked by the test:\n  " + "\n  ".join(problems), pytrace=False)
