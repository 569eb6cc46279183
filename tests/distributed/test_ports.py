"""`held_port`: a launcher's port stays its own until the store that listens there is up."""

from __future__ import annotations

import socket
from datetime import timedelta

import pytest
import torch.distributed as dist

from aiocollect._workers._ports import held_port


def _binds(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


@pytest.mark.parametrize("other_address", ["127.0.0.1", "127.0.0.2", ""])
def test_a_held_port_is_refused_to_other_sockets_on_any_address(other_address: str) -> None:
    # What a bind(0) elsewhere would check before taking the port: it must find it in use.
    with held_port("127.0.0.1") as port:
        assert not _binds(port, other_address)
    assert _binds(port, other_address)  # and it is free again once let go


def test_a_tcpstore_listens_on_the_held_port_while_it_is_held() -> None:
    with held_port("127.0.0.1") as port:
        server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
        client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=30))
        client.set("seen", "yes")
        assert server.get("seen") == b"yes"
        del client, server
