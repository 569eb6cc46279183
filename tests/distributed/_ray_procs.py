"""Ray-aware process snapshots for the Ray tests.

Ray runs system processes (raylet, GCS, agents) and keeps a pool of idle worker processes
(``ray::IDLE``) that it starts and retires on its own schedule. They belong to the Ray
instance, not to the test that happened to be running; anything else new in the process
tree (an actor that outlived its collector, the processes its collector started) is.
"""

from __future__ import annotations

import re

import psutil
from _leaks import Snapshot, take_snapshot

__all__ = ["ray_processes", "ray_snapshot"]

_RAY_OWN = re.compile(
    r"^ray::IDLE|default_worker\.py|raylet|gcs_server|ray/dashboard|log_monitor|ray_client_server|"
    r"runtime_env/agent|ray/_private|ray::(?!NodeHost)"
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
    return Snapshot(threads=snap.threads, children=keep, shm=snap.shm, fd_count=snap.fd_count)
