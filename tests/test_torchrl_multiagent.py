"""Multi-agent and nested-key TorchRL envs: the batches TorchRL's collector gives, entry for entry.

Rewards and done flags that live under agent groups (``("data", "reward")``,
``("agents", "agent_0", "done")``) are recorded where TorchRL records them: rewards under
``"next"`` only, done flags at the root and under ``"next"``, and no root flag the env does
not have. Nested groups keep their own batch dims (``[*B, T, n_agents]``), also when the
batch comes from a worker process. The batches hold exactly TorchRL's keys.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Iterator

import pytest
import torch

pytest.importorskip("torchrl.envs")

from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torchrl.collectors import Collector as TorchRLCollector
from torchrl.envs import SerialEnv
from torchrl.testing.mocking_classes import MultiAgentCountingEnv, NestedCountingEnv

from aiocollect import MultiSyncDataCollector, SyncDataCollector

pytestmark = pytest.mark.timeout(120)

ROOT_FLAGS = {key for k in ("done", "terminated", "truncated") for key in (k, ("next", k))}


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    # A SerialEnv's shared-memory buffers (a descriptor each) live in reference cycles, of
    # TorchRL's collector and ours alike: collect them before the leak check counts (it runs
    # first at teardown).
    yield
    gc.collect()


class Ones(torch.nn.Module):
    """Every agent's action is 1 (a counting env then counts up by one per step)."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.dtype = dtype

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.ones(obs.shape, dtype=self.dtype)


def nested(max_steps: int) -> NestedCountingEnv:
    # Observation, action, reward and done flags all under "data", with 3 agents: [*B, 3, 1].
    return NestedCountingEnv(max_steps=max_steps, nested_dim=3)


def two_nested() -> SerialEnv:
    # Different episode lengths, so one env resets while the other runs on (partial resets
    # through TorchRL's ("data", "_reset")).
    return SerialEnv(2, [functools.partial(nested, 2), functools.partial(nested, 4)])


def nested_policy(env: object) -> TensorDictModule:
    dtype = env.full_action_spec["data", "action"].dtype  # type: ignore[attr-defined]
    return TensorDictModule(Ones(dtype), in_keys=[("data", "states")], out_keys=[("data", "action")])


def collect(make: object, env: object, policy: object, n_batches: int = 4, frames: int = 20) -> list[TensorDict]:
    # TorchRL 0.14 warns that it will add the transforms it guesses a policy needs; these
    # policies need none (the opt-out keeps its current behaviour).
    extra = {"auto_register_policy_transforms": False} if make is TorchRLCollector else {}
    collector = make(env, policy, frames_per_batch=frames, total_frames=frames * n_batches, **extra)
    try:
        return [batch.clone() for batch in collector]
    finally:
        collector.shutdown()


def leaves(td: TensorDict) -> set:
    return set(td.keys(True, True))


def compare(ours: list[TensorDict], theirs: list[TensorDict], skip_values: set) -> None:
    assert len(ours) == len(theirs) >= 3
    for i, (a, t) in enumerate(zip(ours, theirs, strict=True)):
        assert a.shape == t.shape, i
        assert leaves(t) <= leaves(a), (i, leaves(t) - leaves(a))
        assert leaves(a) == leaves(t), i  # exactly TorchRL's keys
        assert a.batch_size == t.batch_size and a.names == t.names, i
        for key in sorted(leaves(t), key=str):
            x, y = a.get(key), t.get(key)
            assert (x.shape, x.dtype) == (y.shape, y.dtype), (i, key)
            if key not in skip_values:
                assert torch.equal(x, y), (i, key)


def test_nested_agent_entries_match_torchrls_batches_through_partial_resets() -> None:
    policy = nested_policy(nested(2))
    theirs = collect(TorchRLCollector, two_nested, policy)
    ours = collect(SyncDataCollector, two_nested, policy)
    compare(ours, theirs, skip_values=set())
    for a in ours:
        assert a["next", "data", "reward"].shape == (2, 10, 3, 1)
        assert "reward" not in a["next"].keys(), "the env has no root reward, nor do TorchRL's batches"
        assert not ROOT_FLAGS & leaves(a), "nor a root done flag"
        # Nested groups keep their batch dims: [envs, steps, agents].
        assert a["next", "data"].batch_size == (2, 10, 3)
    # Both envs ended episodes, at different steps: the partial-reset path was compared.
    ends = torch.cat([t["next", "data", "done"].any(-2).squeeze(-1) for t in theirs], dim=-1)
    assert ends.any(-1).all() and not torch.equal(ends[0], ends[1])


def agents(max_steps: int = 3) -> MultiAgentCountingEnv:
    # One group of 2 agents, each with its own reward and done entries, and an "env_done" at
    # the root: no root "reward" or "done" at all.
    return MultiAgentCountingEnv(n_agents=2, max_steps=max_steps)


def agents_policy(env: object) -> TensorDictModule:
    keys = [k for k in env.full_action_spec.keys(True, True)]  # type: ignore[attr-defined]
    dtype = env.full_action_spec[keys[0]].dtype  # type: ignore[attr-defined]
    obs = [(*k[:-1], "observation") for k in keys]

    class PerAgent(torch.nn.Module):
        def forward(self, *observations: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return tuple(torch.ones((*o.shape[:-2], 1), dtype=dtype) for o in observations)

    return TensorDictModule(PerAgent(), in_keys=obs, out_keys=keys)


def test_per_agent_rewards_and_dones_without_root_flags_match_torchrls_batches() -> None:
    env = agents()
    policy = agents_policy(env)
    obs_keys = [k for k in env.observation_spec.keys(True, True)]
    env.close()
    theirs = collect(TorchRLCollector, agents, policy)
    ours = collect(SyncDataCollector, agents, policy)
    # The observations are torch.rand draws (this mock env's), so only their layout can match.
    compare(ours, theirs, skip_values={*obs_keys, *(("next", *k) for k in obs_keys)})
    assert any(bool(t["next", "env_done"].any()) for t in theirs)
    for a in ours:
        assert a["next", "agents", "agent_1", "reward"].shape == (20, 1)
        assert not ROOT_FLAGS & leaves(a)


def test_nested_agent_envs_in_worker_processes() -> None:
    policy = nested_policy(nested(2))
    ours = collect(MultiSyncDataCollector, [two_nested, two_nested], policy, n_batches=3, frames=40)
    for batch in ours:
        assert batch["next", "data", "reward"].shape == (2, 2, 10, 3, 1)  # [workers, envs, steps, agents, 1]
        assert batch["data", "states"].shape == (2, 2, 10, 3, 1)
        assert batch["next", "data"].batch_size == (2, 2, 10, 3)  # the group's own dim survives the slot
        assert batch["next", "data", "done"].any()
        assert "reward" not in batch["next"].keys()


def test_set_seed_seeds_a_torchrl_env_with_the_given_seed() -> None:
    from torchrl.envs import GymEnv

    seen: list[int] = []

    class Recording(GymEnv):
        def _set_seed(self, seed: int | None) -> None:
            seen.append(seed)  # type: ignore[arg-type]
            super()._set_seed(seed)

    def make() -> GymEnv:
        return Recording("Pendulum-v1")

    collector = SyncDataCollector(make, None, frames_per_batch=8, total_frames=16)
    try:
        collector.set_seed(1234)
        batches = [b.clone() for b in collector]
    finally:
        collector.shutdown()
    assert seen == [1234], "TorchRL's collector.set_seed(s) calls env.set_seed(s) with s itself"
    reference = make()
    reference.set_seed(1234)
    assert torch.equal(batches[0]["observation"][0], reference.reset()["observation"])
    reference.close()


def gym_pendulum() -> object:
    from torchrl.envs import GymEnv

    return GymEnv("Pendulum-v1")


def test_set_seed_chains_the_seed_through_workers_as_torchrl_does() -> None:
    # TorchRL's multi-process set_seed(s): worker 0's env gets s, worker 1's what worker 0's
    # env.set_seed(s) returned (one link of TorchRL's seed chain per env).
    from torchrl._utils import seed_generator
    from torchrl.envs import GymEnv

    collector = MultiSyncDataCollector([gym_pendulum, gym_pendulum], None, frames_per_batch=8, total_frames=8)
    try:
        collector.set_seed(1234)
        (batch,) = [b.clone() for b in collector]
    finally:
        collector.shutdown()
    for w, seed in enumerate([1234, seed_generator(1234)]):
        reference = GymEnv("Pendulum-v1")
        reference.set_seed(seed)
        assert torch.equal(batch[w, 0]["observation"], reference.reset()["observation"]), w
        reference.close()
