"""Envs from outside aiocollect's own protocols that every distributed collector's tests run on nodes.

Each collector kind (torch.distributed, RPC, Ray) runs these on two nodes with random
actions; every node rebuilds the env from its factory:

* ``torchrl_pendulum``: a TorchRL env; the batches must carry TorchRL's keys (a
  ``StepCounter``'s) and the collector's worker ids;
* ``sleepy_pool``: an `AsyncEnvPool` of coroutine envs, stepped on the node's event loop;
  the batches must hold real transitions of every env.

``NODE_ENVS[kind]()`` gives ``(factory, check)``; `check_envs_on_nodes` runs one kind on a
collector class. `check_factory_weights_reach_inner_workers` runs the same weight-update check
on every collector kind (pytorch/rl#3729, where it failed for Ray and RPC), and
`check_update_forms` TorchRL's forms of ``update_policy_weights_`` with the kind's own scheme,
`check_weights_reach_factory_policies` TorchRL's lazy weight sync (``policy_factory``, no
``policy``: the first update's weights lay the nodes' weights out), and
`check_whole_episodes_on_nodes` the complete-trajectory mode (``trajs_per_batch``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import pytest
import torch

__all__ = [
    "NODE_ENVS",
    "check_a_close_failure_on_a_node",
    "check_each_nodes_episodes_in_order",
    "check_envs_on_nodes",
    "check_factory_weights_reach_inner_workers",
    "check_torchrl_node_batches",
    "check_update_forms",
    "check_updates_reach_each_node",
    "check_weights_reach_factory_policies",
    "check_whole_episodes_on_nodes",
    "episodes_of",
    "record_call",
    "recorded_calls",
    "sleepy_pool",
    "torchrl_pendulum",
]


def torchrl_pendulum() -> Any:
    from torchrl.envs import GymEnv, StepCounter, TransformedEnv

    return TransformedEnv(GymEnv("Pendulum-v1"), StepCounter(7))


def check_torchrl_node_batches(batches: list[Any]) -> None:
    """Two batches of 40 frames, each with both nodes' frames, TorchRL's keys and resets."""
    assert [b.numel() for b in batches] == [40, 40]
    for b in batches:
        assert {"step_count", ("next", "step_count"), ("next", "truncated")} <= set(b.keys(True, True))
        assert sorted(b["collector", "worker_id"].unique().tolist()) == [0, 1]
        assert bool(b["next", "truncated"].any())  # StepCounter(7) truncates inside each node's 20 steps
        assert bool((b["action"].abs() <= 2).all())  # random actions from the env's action spec


def sleepy_pool() -> Any:
    from aiocollect import AsyncEnvPool
    from aiocollect.testing import SleepyAsyncEnv

    return AsyncEnvPool([SleepyAsyncEnv(delay=0.001, episode_length=5) for _ in range(4)])


def check_coroutine_node_batches(batches: list[Any]) -> None:
    """Two batches of 40 frames, both nodes' in each: real transitions, episodes of 5 steps."""
    assert [b.numel() for b in batches] == [40, 40]
    for b in batches:
        assert sorted(b["collector", "worker_id"].unique().tolist()) == [0, 1]
        nxt, obs = b["next", "observation"][..., 0], b["observation"][..., 0]
        assert torch.equal(nxt, obs + 1)
        assert torch.equal(b["next", "done"][..., 0], nxt == 5)


def _torchrl() -> tuple[Callable[[], Any], Callable[[list[Any]], None]]:
    pytest.importorskip("torchrl.envs")
    return torchrl_pendulum, check_torchrl_node_batches


NODE_ENVS: dict[str, Callable[[], tuple[Callable[[], Any], Callable[[list[Any]], None]]]] = {
    "torchrl": _torchrl,
    "coroutine": lambda: (sleepy_pool, check_coroutine_node_batches),
}


async def check_envs_on_nodes(collector_class: Any, kind: str, **kw: Any) -> None:
    """Two synchronous batches of 40 frames from two nodes running ``kind``'s env, checked."""
    env, check = NODE_ENVS[kind]()
    with anyio.fail_after(90):
        async with collector_class([env] * 2, None, frames_per_batch=40, total_frames=80, sync=True, **kw) as c:
            batches = [b async for b in c]
    check(batches)


async def check_a_close_failure_on_a_node(collector_class: Any, **kw: Any) -> None:
    """Node 1's env fails to close: closing the collector raises it, naming that node, with its traceback."""
    from aiocollect import WorkerError
    from aiocollect.testing import CountingEnv, FailingEnv

    fns = [CountingEnv, partial(FailingEnv, 1, None, fail_on_close=True)]
    with anyio.fail_after(90), pytest.raises(WorkerError) as info:
        async with collector_class(fns, None, frames_per_batch=20, total_frames=40, sync=True, **kw) as c:
            assert len([b async for b in c]) == 2
    err = info.value
    assert err.worker_id == 1 and "rank 2" in str(err)
    assert "FailingEnv failed to close" in str(err)
    assert "in close" in str(err.__cause__.__cause__)  # the node's own traceback


def scripted(weight: float = 1.0) -> Any:
    """``action = obs.sum(-1) * weight > 0`` as a TensorDict module (a policy, or a node's policy factory)."""
    from tensordict.nn import TensorDictModule

    from aiocollect.testing import ScriptedPolicy

    return TensorDictModule(ScriptedPolicy(weight), ["observation"], ["action"])


async def check_factory_weights_reach_inner_workers(collector_class: Any, *, explicit: bool, **kw: Any) -> None:
    """Nodes running a multi collector whose workers build their policy with ``policy_factory``.

    An update reaches every inner worker, whether it is read from the trainer's ``policy=`` or
    passed explicitly (``explicit``): TorchRL's Ray and RPC collectors once left those workers
    with their factory-built weights forever (pytorch/rl#3729).
    """
    from aiocollect.testing import CountingEnv

    version, worker_id = ("collector", "policy_version"), ("collector", "worker_id")
    env = partial(CountingEnv, 1, episode_length=7)
    policy = scripted(1.0)  # lays the weights out; the nodes' workers build their own
    with anyio.fail_after(90):
        async with collector_class(
            [env] * 2, policy, policy_factory=partial(scripted, 1.0), collector_class="sync",
            num_workers_per_collector=2, frames_per_batch=40, total_frames=-1, sync=True, **kw,
        ) as c:  # fmt: skip
            first = await c.__anext__()
            if explicit:
                await c.update_policy_weights_(scripted(-1.0))
            else:
                with torch.no_grad():
                    policy.module.weight.fill_(-1.0)
                await c.update_policy_weights_()
            after = await c.__anext__()
    moved = after["observation"][..., 2] > 0  # a positive observation sum: the weight's sign decides
    assert (first["action"][first["observation"][..., 2] > 0] == 1).all()
    assert set(after[worker_id].flatten().tolist()) == {0, 1, 2, 3}, "every inner worker collected"
    assert (after[version] == 1).all()
    assert moved.any() and (after["action"][moved] == 0).all(), "an inner worker kept its factory-built weights"


def _acts(batch: Any, node: int) -> set[int]:
    """The actions node ``node`` took where the observation is positive (1: weight 1; 0: weight -1)."""
    part = batch[node]
    return set(part["action"][part["observation"][..., 2] > 0].tolist())


async def check_update_forms(collector_class: Any, scheme: Any, **kw: Any) -> None:
    """TorchRL's ``update_policy_weights_`` forms on two ``sync=True`` nodes synced by ``scheme``.

    ``policy=`` with ``worker_ids=[1]`` reaches node 1 only (node 0 keeps its weights and
    version), ``weights_dict=`` every node, ``model_id=`` with ``worker_ids=0`` node 0 only.
    """
    from aiocollect.testing import CountingEnv

    version = ("collector", "policy_version")
    with anyio.fail_after(90):
        async with collector_class(
            [partial(CountingEnv, 1, episode_length=7)] * 2, scripted(1.0), frames_per_batch=20, total_frames=-1,
            sync=True, weight_sync_schemes={"policy": scheme}, **kw,
        ) as c:  # fmt: skip
            first = await c.__anext__()
            assert _acts(first, 0) == _acts(first, 1) == {1}
            await c.update_policy_weights_(policy=scripted(-1.0), worker_ids=[1])
            only_one = await c.__anext__()
            await c.update_policy_weights_(weights_dict={"policy": scripted(-1.0).state_dict()})
            both = await c.__anext__()
            await c.update_policy_weights_(scripted(1.0), model_id="policy", worker_ids=0)
            back = await c.__anext__()
    assert (only_one[0][version] == 0).all() and _acts(only_one, 0) == {1}
    assert (only_one[1][version] == 1).all() and _acts(only_one, 1) == {0}
    assert (both[version] == 2).all() and _acts(both, 0) == _acts(both, 1) == {0}
    assert (back[0][version] == 3).all() and _acts(back, 0) == {1}
    assert (back[1][version] == 2).all() and _acts(back, 1) == {0}


async def check_weights_reach_factory_policies(collector_class: Any, *, before_start: bool, **kw: Any) -> None:
    """Nodes build their policy with ``policy_factory`` and no ``policy=`` is given here.

    TorchRL's lazy weight sync: explicit weights (``TensorDict.from_module``, a state dict) lay
    the nodes' weights out, whether given before the nodes start or once they run.
    """
    from tensordict import TensorDict

    from aiocollect.testing import CountingEnv

    version = ("collector", "policy_version")
    with anyio.fail_after(90):
        c = collector_class(
            [partial(CountingEnv, 1, episode_length=7)] * 2, None, policy_factory=partial(scripted, 1.0),
            frames_per_batch=20, total_frames=-1, sync=True, **kw,
        )  # fmt: skip
        if before_start:
            await c.update_policy_weights_(TensorDict.from_module(scripted(-1.0)))
        async with c:
            if not before_start:
                first = await c.__anext__()
                assert _acts(first, 0) == _acts(first, 1) == {1}
                await c.update_policy_weights_(TensorDict.from_module(scripted(-1.0)))
            negated = await c.__anext__()
            await c.update_policy_weights_(scripted(1.0).state_dict())
            back = await c.__anext__()
    assert (negated[version] == 1).all() and _acts(negated, 0) == _acts(negated, 1) == {0}
    assert (back[version] == 2).all() and _acts(back, 0) == _acts(back, 1) == {1}


def check_updates_reach_each_node(batches: list[Any], *, from_batch: int) -> None:
    """Free-running nodes: each node's batches from its ``from_batch``-th (0-based) on hold updates.

    A node has batches collected (or asked for) before the first update reaches it, and which
    node delivers the last batch is up to the nodes' speed: a node slow to start may deliver
    only its first ones at the end. So the check is per node, in the order each delivered.
    Each batch is one node's, collected with one version; versions never go back.
    """
    by_node: dict[int, list[int]] = defaultdict(list)
    for b in batches:
        node, version = b["collector", "worker_id"], b["collector", "policy_version"]
        assert node.unique().numel() == 1 and version.unique().numel() == 1, "a batch is one node's, one version"
        by_node[int(node.flatten()[0])].append(int(version.flatten()[0]))
    for node, versions in by_node.items():
        assert versions == sorted(versions), f"node {node}'s versions go back: {versions}"
        assert all(v > 0 for v in versions[from_batch:]), f"node {node}'s later batches miss the updates: {versions}"
    assert any(len(v) > from_batch for v in by_node.values()), f"no node delivered {from_batch + 1} batches"


LENGTH = 7  # steps per episode of `check_whole_episodes_on_nodes`' envs


def episodes_of(frames: Any) -> list[tuple[int, int]]:
    """``(node, episode)`` of each whole episode in flat ``frames``, checked frame by frame."""
    obs = frames["observation"].long().tolist()
    nodes = frames["collector", "worker_id"].flatten().tolist()
    done = frames["next", "done"].flatten().tolist()
    out: list[tuple[int, int]] = []
    for i, ((_, episode, step), node) in enumerate(zip(obs, nodes, strict=True)):
        if step == 0:
            out.append((node, episode))
        else:
            assert out and out[-1] == (node, episode), f"frame {i} goes on another node's or episode's trajectory"
        assert done[i] == (step == LENGTH - 1), f"frame {i}: done must mark the episode's last step only"
    assert obs[-1][2] == LENGTH - 1, "the last trajectory is unfinished"
    return out


def check_each_nodes_episodes_in_order(found: list[tuple[int, int]]) -> None:
    by_node: dict[int, list[int]] = defaultdict(list)
    for node, episode in found:
        by_node[node].append(episode)
    assert sorted(by_node) == [0, 1], "both nodes' episodes are delivered"
    for node, eps in by_node.items():
        assert eps == list(range(len(eps))), f"node {node}'s episodes were lost, repeated or reordered: {eps}"


async def check_whole_episodes_on_nodes(collector_class: Any, **kw: Any) -> None:
    """``trajs_per_batch=3`` on two nodes: padded batches of whole episodes, none lost or mixed.

    Each node runs a ``CountingEnv`` whose observation is ``[0, episode, step]`` (both nodes'
    envs have index 0, so only the worker id tells them apart) with episodes of 7 steps, cut
    by batches whose per-node size is no multiple of 7: an episode that goes on from one batch
    to the next must be continued with its own node's steps. Per node, the episodes delivered
    must be 0, 1, 2, ... with none lost, repeated or mixed with the other node's.
    """
    from aiocollect.testing import CountingEnv

    env = partial(CountingEnv, 1, episode_length=LENGTH)
    with anyio.fail_after(90):
        async with collector_class(
            [env] * 2, None, frames_per_batch=10, total_frames=150, trajs_per_batch=3, **kw
        ) as c:
            batches = [b async for b in c]
    assert batches and all(b.shape == (3, LENGTH) and b.names[-1] == "time" for b in batches)
    assert all(bool(b["collector", "mask"].all()) for b in batches)  # equal lengths: no padding
    found = [ep for b in batches for ep in episodes_of(b.reshape(-1))]
    assert len(found) == 3 * len(batches)
    check_each_nodes_episodes_in_order(found)
    # The nodes' 150 frames (f0 + f1) hold floor(f0 / 7) + floor(f1 / 7) whole episodes, 20 or
    # 21: every complete group of 3 is delivered, the rest dropped when the budget is spent.
    assert len(batches) in (6, 7)


def record_call(directory: str, kind: str, *args: Any) -> None:
    """A hook that leaves a file named for its kind and process in ``directory`` (any process, any actor)."""
    import os
    import uuid

    (Path(directory) / f"{kind}-{os.getpid()}-{uuid.uuid4().hex}").touch()


def recorded_calls(directory: Path, kind: str) -> list[int]:
    """The pids of the processes that ran `record_call` for ``kind``, one per call."""
    return [int(f.name.split("-")[1]) for f in directory.iterdir() if f.name.startswith(f"{kind}-")]
