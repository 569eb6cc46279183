"""256 coroutine envs talking to a real server over loopback TCP, collected by one Collector.

The server (started by the test, in its own task group) keeps each connection's episode:
``reset`` answers ``0 0``, ``step a`` adds ``1 + a`` to the count and answers ``count steps``.
Every transition the collector recorded is checked against that rule, the server's step
count against the frames delivered, and every connection must be closed by the time the
collector's ``async with`` block has been left.
"""

from __future__ import annotations

from typing import Any

import anyio
import numpy as np
import pytest
import torch
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from gymnasium import spaces

from aiocollect import AsyncEnvPool, Collector

pytestmark = [pytest.mark.anyio, pytest.mark.all_backends, pytest.mark.timeout(120)]

EPISODE = 6


class Server:
    """Counts steps and open connections; ``idle`` is set whenever none is open."""

    def __init__(self) -> None:
        self.steps = 0
        self.open = 0
        self.idle = anyio.Event()

    async def handle(self, stream: SocketStream) -> None:
        self.open += 1
        self.idle = anyio.Event()
        count = steps = 0
        reader = BufferedByteReceiveStream(stream)
        try:
            async with stream:
                while True:
                    try:
                        line = (await reader.receive_until(b"\n", 64)).decode()
                    except (anyio.EndOfStream, anyio.IncompleteRead):
                        return
                    if line == "reset":
                        count = steps = 0
                    else:
                        count += 1 + int(line.split()[1])
                        steps += 1
                        self.steps += 1
                    await stream.send(f"{count} {steps}\n".encode())
        finally:
            self.open -= 1
            if self.open == 0:
                self.idle.set()


class TcpCounterEnv:
    """A coroutine env whose state lives in the server: one connection, one request per call."""

    observation_space = spaces.Box(0, np.inf, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self, port: int) -> None:
        self.port = port
        self.stream: SocketStream | None = None
        self.reader: BufferedByteReceiveStream | None = None

    async def _ask(self, line: str) -> tuple[int, int]:
        if self.stream is None:
            self.stream = await anyio.connect_tcp("127.0.0.1", self.port)
            self.reader = BufferedByteReceiveStream(self.stream)
        assert self.reader is not None
        await self.stream.send(f"{line}\n".encode())
        count, steps = (await self.reader.receive_until(b"\n", 64)).decode().split()
        return int(count), int(steps)

    async def reset(self, *, seed: int | None = None) -> tuple[Any, dict]:
        count, _ = await self._ask("reset")
        return np.array([count], np.float32), {}

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        count, steps = await self._ask(f"step {int(action)}")
        return np.array([count], np.float32), 1.0, steps >= EPISODE, False, {}

    async def aclose(self) -> None:
        if self.stream is not None:
            await self.stream.aclose()


async def test_256_envs_over_loopback_tcp_exact_transitions_and_clean_shutdown() -> None:
    server = Server()
    n, steps = 256, 8
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
    async with listener, anyio.create_task_group() as tg:
        port = listener.extra(anyio.abc.SocketAttribute.local_port)
        tg.start_soon(listener.serve, server.handle)
        with anyio.fail_after(60):
            pool = lambda: AsyncEnvPool([TcpCounterEnv(port) for _ in range(n)])  # noqa: E731
            async with Collector(pool, frames_per_batch=n * steps, total_frames=2 * n * steps) as c:
                batches = [b async for b in c]
            await server.idle.wait()  # every connection closed by the collector's exit
        tg.cancel_scope.cancel()
    assert [b.shape for b in batches] == [torch.Size([n, steps])] * 2
    frames = sum(b.numel() for b in batches)
    assert server.steps == frames  # no step lost or repeated
    for b in batches:
        obs, nxt = b["observation"][..., 0], b["next", "observation"][..., 0]
        action, done = b["action"], b["next", "done"][..., 0]
        assert torch.equal(nxt, obs + 1 + action)  # the server's rule, for every recorded frame
        ends = done.nonzero()
        assert len(ends) > 0
        t_ok = ends[:, 1] + 1 < steps
        after = b["observation"][ends[t_ok, 0], ends[t_ok, 1] + 1, 0]
        assert torch.equal(after, torch.zeros_like(after))  # each env reset after its episode
