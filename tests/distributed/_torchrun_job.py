"""A job for ``torchrun --nproc-per-node N``: rank 0 trains, every other rank is a collection node.

Run by tests/distributed/test_launchers.py; the trainer writes what it saw to argv[1] as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from functools import partial

import anyio


async def trainer(out: str) -> None:
    from tensordict.nn import TensorDictModule

    from aiocollect import DistributedCollector
    from aiocollect.testing import CountingEnv, ScriptedPolicy

    nodes = int(os.environ["WORLD_SIZE"]) - 1
    policy = TensorDictModule(ScriptedPolicy(1.0), ["observation"], ["action"])
    fns = [partial(CountingEnv, 1, episode_length=5, first_index=10 * n) for n in range(nodes)]
    async with DistributedCollector(
        fns, policy, frames_per_batch=10 * nodes, total_frames=30 * nodes, sync=True, launcher="external"
    ) as c:
        firsts = [b["observation"][:, 0, 0, 0].tolist() async for b in c]
    await anyio.Path(out).write_text(json.dumps({"firsts": firsts, "frames": c.stats().frames}))


if __name__ == "__main__":
    if os.environ["RANK"] == "0":
        anyio.run(trainer, sys.argv[1])
    else:
        from aiocollect.node import main

        main()
