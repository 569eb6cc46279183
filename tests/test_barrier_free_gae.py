"""Barrier-free batches with ``set_truncated=True`` feed TorchRL's GAE as they come.

Frames are grouped by env and each env's last frame in the batch is marked truncated, so GAE
over the flat batch equals GAE over each env's run on its own: nothing bootstraps across two
envs' runs.
"""

from __future__ import annotations

import anyio
import pytest
import torch

pytest.importorskip("torchrl.objectives")

# Imported here, not first inside a test: its optional `import gym` keeps the frames of the
# first caller alive for ever (see tests/test_torchrl_dropin.py).
import torchrl.envs.libs.utils  # noqa: F401
from tensordict.nn import TensorDictModule
from torchrl.objectives.value import GAE

from aiocollect import AsyncEnvPool, Collector
from aiocollect.testing import SleepyAsyncEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

ENV = ("collector", "env_id")


def uneven_pool() -> AsyncEnvPool:
    # Envs of three speeds: their runs in a batch have different lengths; episodes of 7 steps
    # end inside the batch, so it holds terminations as well as the batch-end truncations.
    return AsyncEnvPool([SleepyAsyncEnv(delay=0.001 * (i % 3 + 1), episode_length=7) for i in range(4)], min_ready=1)


async def two_batches(set_truncated: bool) -> list:
    pool = uneven_pool()
    with anyio.fail_after(20):
        async with Collector(lambda: pool, frames_per_batch=64, total_frames=128, set_truncated=set_truncated) as c:
            return [b.clone() async for b in c]


async def test_set_truncated_marks_each_envs_last_frame_and_the_trajectory_goes_on() -> None:
    first, second = await two_batches(set_truncated=True)
    env = first[ENV]
    last = [k for k in range(64) if k == 63 or env[k + 1] != env[k]]
    trunc = first["next", "truncated"].squeeze(-1)
    assert trunc.nonzero().flatten().tolist() == last
    assert torch.equal(first["next", "done"], first["next", "terminated"] | first["next", "truncated"])
    for k in last:  # not reset: the env's next frame (next batch) continues the same trajectory
        e = int(env[k])
        if first["next", "terminated"][k]:
            continue
        nxt = (second[ENV] == e).nonzero().flatten()
        if len(nxt):
            j = int(nxt[0])
            assert second["collector", "traj_ids"][j] == first["collector", "traj_ids"][k]
            assert torch.equal(second["observation"][j], first["next", "observation"][k])


@pytest.mark.parametrize("set_truncated", [True, False])
async def test_gae_on_the_flat_batch_equals_gae_on_each_envs_run(set_truncated: bool) -> None:
    (batch, _) = await two_batches(set_truncated)
    value = TensorDictModule(torch.nn.Linear(1, 1), ["observation"], ["state_value"])
    with torch.no_grad():
        value.module.weight.fill_(0.3)
        value.module.bias.fill_(-0.2)
        gae = GAE(gamma=0.9, lmbda=0.8, value_network=value)
        flat = gae(batch.clone())["advantage"]
        env = batch[ENV]
        each = torch.cat([gae(batch[env == e].clone())["advantage"] for e in env.unique(sorted=True).tolist()])
    if set_truncated:
        torch.testing.assert_close(flat, each)
        return
    # Without the marks, an env's last frame that ends no episode bootstraps into the next
    # env's run (its one-step error there is > 1 with this value function, never 0).
    done = batch["next", "done"].squeeze(-1)
    leaky = [k for k in range(len(env) - 1) if env[k + 1] != env[k] and not done[k]]
    assert all(not torch.isclose(flat[k], each[k]).all() for k in leaky)
