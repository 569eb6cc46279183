"""While nodes start (and RPC nodes stop), each node's task is woken by its own node's events only.

One task per node waits for its node to join, then to be ready (and, under RPC and Ray, to
be gone when it stops). If every node's event woke every such task, N nodes would cost
N²/2 wake-ups (`tests/test_notify.py` checks the notifier itself;
`benchmarks/bench_wakeups.py` measures it). Here real nodes start and stop, and every wait
that names a node is counted (`_counting_notifier.py`). The RPC case is in `test_rpc.py`,
whose module fixture absorbs TensorPipe's process-wide descriptors.
"""

from __future__ import annotations

import anyio
import pytest
from _counting_notifier import CountingNotifier
from tensordict.nn import TensorDictModule

from aiocollect import DistributedCollector
from aiocollect._workers import _distributed
from aiocollect.testing import CountingEnv, ScriptedPolicy

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

NODES = 4


def counting() -> CountingEnv:
    return CountingEnv(1, episode_length=7)


async def test_a_nodes_start_is_not_woken_by_the_other_nodes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_distributed, "Notifier", CountingNotifier)
    monkeypatch.setattr(CountingNotifier, "waits", [])
    policy = TensorDictModule(ScriptedPolicy(1.0), ["observation"], ["action"])
    c = DistributedCollector(
        [counting] * NODES, policy, frames_per_batch=8 * NODES, total_frames=8 * NODES, sync=True,
        launcher="mp", shutdown_timeout=5.0,
    )  # fmt: skip
    with anyio.fail_after(90):
        async with c:
            batches = [b async for b in c]
    assert len(batches) == 1
    waits = CountingNotifier.waits
    # Each node's start waited twice under its own key (joined, then ready)...
    assert sorted(key for key, _, _ in waits) == sorted(list(range(NODES)) * 2), waits
    # ...and neither wait was woken by another node's event.
    assert CountingNotifier.woken_by_others() == [], waits
