"""The socket audit itself: it must see a non-loopback socket, or it proves nothing."""

from __future__ import annotations

import socket

from _net import outside_loopback


def test_audit_sees_a_socket_bound_outside_loopback() -> None:
    addr = next(
        (a for a in {i[4][0] for i in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
         if not a.startswith("127.")),
        None,
    )  # fmt: skip
    with socket.socket() as s:
        if addr is None:  # no other interface here: a wildcard bind is not a peer, so use a UDP "connect"
            s2 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s2.connect(("192.0.2.1", 9))  # TEST-NET-1: nothing is sent by a UDP connect
            try:
                assert any("192.0.2.1" in v for v in outside_loopback())
            finally:
                s2.close()
            return
        s.bind((addr, 0))
        s.listen()
        assert any(addr in v for v in outside_loopback())


def test_audit_is_quiet_on_loopback() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert outside_loopback() == []


def test_audit_ignores_only_dns_datagrams_to_the_system_resolvers(monkeypatch) -> None:
    import _net

    monkeypatch.setattr(_net, "_RESOLVERS", {"192.0.2.53"})
    with (
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as dns,
        socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other,
    ):
        dns.connect(("192.0.2.53", 53))  # a UDP connect sends nothing
        other.connect(("192.0.2.53", 54))
        seen = outside_loopback()
    assert seen and all("port=54" in v for v in seen)
