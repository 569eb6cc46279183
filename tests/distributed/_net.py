"""Socket audit helpers of the distributed tests (imported by conftest and tests)."""

from __future__ import annotations

import ipaddress
import socket
import threading
from pathlib import Path
from typing import Any

import psutil

__all__ = ["SocketAudit", "outside_loopback"]


def _is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def _resolvers() -> set[str]:
    try:
        lines = Path("/etc/resolv.conf").read_text().splitlines()
    except OSError:
        return set()
    return {line.split()[1] for line in lines if line.startswith("nameserver") and len(line.split()) > 1}


_RESOLVERS = _resolvers()


def _name_lookup(c: Any) -> bool:
    # torch's c10d formats every store connection's address with getnameinfo() for its logs:
    # a reverse lookup of ::ffff:127.0.0.1 that /etc/hosts cannot answer goes to the system
    # resolver. That is name resolution by libc, not traffic of the collector.
    return c.type == socket.SOCK_DGRAM and bool(c.raddr) and c.raddr.port == 53 and c.raddr.ip in _RESOLVERS


# Ray's dashboard process, which every Ray head starts (with include_dashboard=False it loads
# only its usage-stats module), asks the link-local cloud metadata service which cloud it runs
# on, whatever RAY_USAGE_STATS_ENABLED says (ray/_common/usage/usage_lib.py,
# get_cloud_from_metadata_requests; three HTTP GETs with a 1 s timeout). Nothing of aiocollect
# opens these, and Ray has no setting that stops them.
_CLOUD_METADATA = ("169.254.169.254", 80)


def _ray_cloud_probe(proc: psutil.Process, c: Any) -> bool:
    if not c.raddr or (c.raddr.ip, c.raddr.port) != _CLOUD_METADATA:
        return False
    try:
        return any(arg.endswith("ray/dashboard/dashboard.py") for arg in proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return False


def outside_loopback() -> list[str]:
    """Inet sockets of this process tree whose local or remote address is not loopback.

    Datagram sockets to the system's DNS resolvers (see `_name_lookup`) and the cloud-metadata
    probe of Ray's dashboard process (see `_ray_cloud_probe`) are not counted.
    """
    me = psutil.Process()
    bad = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for c in conns:
            if _name_lookup(c) or _ray_cloud_probe(proc, c):
                continue
            for end in (c.laddr, c.raddr):
                if end and not _is_loopback(end.ip):
                    bad.append(f"pid {proc.pid}: {c.laddr} -> {c.raddr} ({c.status})")
    return bad


class SocketAudit:
    """Samples the process tree's sockets in a thread until stopped; `check` samples now."""

    def __init__(self) -> None:
        self.violations: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="socket-audit", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.05):  # a sampling period, not an ordering of events
            self.violations += outside_loopback()

    def check(self) -> None:
        """Fail now if any socket of the tree reaches outside loopback."""
        bad = outside_loopback()
        assert not bad, "non-loopback sockets: " + "; ".join(bad)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
