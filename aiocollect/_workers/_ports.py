"""A free port held for a listener that other code opens later (a TCPStore, torch RPC's rendezvous).

Picking a port by binding port 0 and closing the socket leaves it free for anyone until the
listener binds it, and the launchers spend seconds in between (starting nodes that will
connect there): any process's own ``bind(0)`` may get the same port meanwhile, and the
listener then fails with EADDRINUSE. `held_port` keeps a bound, non-listening socket with
``SO_REUSEADDR`` on the port instead. The kernel hands a bound port to no ``bind(0)`` and no
``connect()``, while a listener that also sets ``SO_REUSEADDR``, as torch's TCPStore does,
still binds and listens there.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["held_port"]


@contextmanager
def held_port(addr: str, chosen: int | None = None) -> Iterator[int]:
    """A port free on every local address of ``addr``'s family, kept from others while open.

    ``chosen``: a port the user gave (``tcp_port``), yielded as it is: theirs to keep free.
    """
    if chosen:
        yield chosen
        return
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # The wildcard address: a port bound only on ``addr`` could still go to a bind(0) on
        # another local address, and a TCPStore listens on all of them.
        s.bind(("::" if family == socket.AF_INET6 else "", 0))
        yield int(s.getsockname()[1])
