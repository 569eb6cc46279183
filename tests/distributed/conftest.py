"""Fixtures of the distributed tests: loopback-only networking and a socket audit.

Every test here binds and connects to loopback addresses only. The ``loopback_only``
fixture (autouse) watches every inet socket of this process and its descendants while the
test runs, and fails the test if any has a peer (or a bound address) outside loopback.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from _net import SocketAudit

# Gloo picks its interface from this variable (the trainer and nodes also bind to the
# addresses they connect from, so aiocollect itself never needs it).
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
os.environ.setdefault("TP_SOCKET_IFNAME", "lo")  # TensorPipe's (torch RPC)
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
# Ray reads these when it is imported: on Linux it otherwise replaces 127.0.0.1 with the
# default route's address for its own connections. No usage statistics are sent.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(scope="session", autouse=True)
def process_wide_state() -> None:
    """Create once what lives for the whole process, before any test's leak snapshot.

    The first TCPStore of a process opens a wake-up pipe that torch keeps (2 fds), and the
    fork server keeps 2 more; they are not leaks of the test that happens to run first.
    """
    import gc
    import multiprocessing
    from multiprocessing import forkserver

    import torch.distributed as dist

    from aiocollect._workers._prestart import preload_forkserver

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    del store
    gc.collect()
    preload_forkserver(multiprocessing.get_context("forkserver"))
    forkserver.ensure_running()


@pytest.fixture(autouse=True)
def loopback_only() -> Iterator[SocketAudit]:
    """Fail the test if any socket of the process tree had a non-loopback address."""
    audit = SocketAudit()
    try:
        yield audit
    finally:
        audit.stop()
    assert not audit.violations, "non-loopback sockets seen: " + "; ".join(sorted(set(audit.violations))[:5])
