"""Socket audit helpers of the distributed tests (imported by conftest and tests)."""

from __future__ import annotations

import ipaddress
import socket
import threading

import psutil

__all__ = ["SocketAudit", "free_port", "outside_loopback"]


def _is_loopback(addr: str) -> bool:
    ip = ipaddress.ip_address(addr.split("%")[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_loopback or ip.is_unspecified


def outside_loopback() -> list[str]:
    """Inet sockets of this process tree whose local or remote address is not loopback."""
    me = psutil.Process()
    bad = []
    for proc in [me, *me.children(recursive=True)]:
        try:
            conns = proc.net_connections(kind="inet")
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        for c in conns:
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


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free now (for launchers that need a port before they start)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
