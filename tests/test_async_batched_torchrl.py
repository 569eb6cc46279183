"""AsyncBatchedCollector over TorchRL envs, as TorchRL's own AsyncBatchedCollector takes them.

Each factory returns one TorchRL env (batch size ``[]``); it is stepped as a gymnasium env in
a shard (`aiocollect._serve._torchrl_env`), and batches must keep TorchRL's keys, dtypes and
shapes, each env's episodes in order, and the very trajectories the in-process collector
gives the same env with a deterministic policy.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import anyio
import pytest
import torch

pytest.importorskip("torchrl.envs")

from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.envs import GymEnv, PendulumEnv, SerialEnv, StepCounter, TransformedEnv

from aiocollect import AsyncBatchedCollector, Collector, WorkerError

pytestmark = pytest.mark.anyio

BACKENDS = ["threading", "multiprocessing"]


def cartpole(seed: int | None = None) -> Any:
    env = TransformedEnv(GymEnv("CartPole-v1"), StepCounter())
    if seed is not None:
        env.set_seed(seed)
    return env


class OneHotArgmax(nn.Module):
    """A deterministic TorchRL-style policy: observation -> one-hot action."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Linear(4, 2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return nn.functional.one_hot(self.net(obs).argmax(-1), 2)


def policy() -> TensorDictModule:
    return TensorDictModule(OneHotArgmax(), in_keys=["observation"], out_keys=["action"])


async def collect(c: Any) -> list[Any]:
    with anyio.fail_after(60):
        async with c:
            return [b async for b in c]


def leaves(td: Any) -> dict[Any, tuple[torch.dtype, tuple[int, ...]]]:
    return {k: (v.dtype, tuple(v.shape[1:])) for k, v in td.items(include_nested=True, leaves_only=True)}


@pytest.mark.parametrize("env_backend", BACKENDS)
async def test_batches_keep_torchrl_keys_dtypes_and_shapes(env_backend: str) -> None:
    (central,) = await collect(AsyncBatchedCollector([cartpole] * 3, frames_per_batch=30, total_frames=30,
                                                     env_backend=env_backend))  # fmt: skip
    (local,) = await collect(Collector(cartpole, frames_per_batch=30, total_frames=30))
    want, got = leaves(local.reshape(-1)), leaves(central)
    for key, (dtype, shape) in want.items():
        if key[0] == "collector" if isinstance(key, tuple) else False:
            continue  # the collectors' own bookkeeping differs by design
        assert key in got, f"{key} missing"
        assert got[key] == (dtype, shape), key
    action = central["action"]
    assert action.dtype == torch.int64 and bool((action.sum(-1) == 1).all()), "random actions are one-hot"


@pytest.mark.parametrize("env_backend", BACKENDS)
async def test_each_env_steps_its_own_episodes_in_order(env_backend: str) -> None:
    batches = await collect(AsyncBatchedCollector([cartpole] * 3, policy=policy(), frames_per_batch=90,
                                                  total_frames=270, env_backend=env_backend))  # fmt: skip
    seen = 0
    for env in range(3):
        rows = [b[b["collector", "env_id"] == env] for b in batches]
        steps = torch.cat([r["step_count"].flatten() for r in rows])
        nxt = torch.cat([r["next", "step_count"].flatten() for r in rows])
        done = torch.cat([r["next", "done"].flatten() for r in rows])
        assert torch.equal(nxt, steps + 1), "StepCounter counts each of the env's own steps"
        assert steps[0] == 0
        after_end = steps[1:][done[:-1]]
        assert bool((after_end == 0).all()), "a new episode starts after each end"
        going_on = steps[1:][~done[:-1]]
        assert torch.equal(going_on, nxt[:-1][~done[:-1]]), "episodes go on where they left off, across batches"
        seen += int(done.sum())
    assert seen > 0


async def test_a_deterministic_policy_gives_each_env_the_collector_trajectory() -> None:
    n, frames = 3, 40
    (central,) = await collect(AsyncBatchedCollector([partial(cartpole, i) for i in range(n)], policy=policy(),
                                                     frames_per_batch=n * frames, total_frames=n * frames))  # fmt: skip
    for i in range(n):
        (local,) = await collect(Collector(partial(cartpole, i), policy(), frames_per_batch=frames,
                                           total_frames=frames))  # fmt: skip
        mine = central[central["collector", "env_id"] == i]
        k = min(len(mine), frames)
        assert k >= 10
        for key in ("observation", "action", ("next", "observation"), ("next", "reward"), ("next", "done")):
            assert torch.equal(mine[key][:k], local[key][:k]), (i, key)


async def test_a_stateless_torchrl_env_gets_its_state_back() -> None:
    # TorchRL's PendulumEnv keeps no state: each step reads it from the TensorDict it is given.
    (batch,) = await collect(AsyncBatchedCollector([PendulumEnv] * 2, frames_per_batch=40, total_frames=40))
    for env in range(2):
        mine = batch[batch["collector", "env_id"] == env]
        for key in ("th", "thdot"):
            assert torch.equal(mine[key][1:], mine["next", key][:-1]), "each step continues the last"
        assert bool((mine["th"][1:] != mine["th"][:-1]).any()), "the pendulum moves"
        assert torch.equal(mine["params", "g"], torch.full_like(mine["params", "g"], 10.0)), "its params ride along"


@pytest.mark.parametrize("env_backend", BACKENDS)
async def test_a_batched_torchrl_env_is_refused(env_backend: str) -> None:
    # In an env process the refusal comes back as the worker's error, naming it, with the
    # refusal (not a failure to close what was built) as its message.
    with anyio.fail_after(60), pytest.raises((TypeError, WorkerError), match=r"batched TorchRL env .*batch size \[2\]"):
        await collect(AsyncBatchedCollector([partial(SerialEnv, 2, PendulumEnv)] * 2, frames_per_batch=10,
                                            env_backend=env_backend))  # fmt: skip
