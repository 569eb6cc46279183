"""How a rollout's storage becomes the batch: the version column and the batch's TensorDict.

`RolloutOutput._wrap` builds the batch with tensordict's unchecked constructor, level by
level, and the policy-version column with two fills when one version ran the whole batch.
Both must give exactly what the checked paths give.
"""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from tensordict import TensorDict

from aiocollect import SyncDataCollector
from aiocollect._rollout._output import _nested, _tree, version_column


@pytest.mark.parametrize(
    ("versions", "T"),
    [
        ([3] * 5, 5),  # one version, every step taken
        ([3] * 3, 5),  # a preempted batch: the missing steps are -1
        ([2, 2, 3, 3, 3], 5),  # a weight update mid-batch
        ([3, 2, 3], 4),  # a version that came back (a loaded state): not one run
        ([], 4),  # no step taken
    ],
)
def test_the_version_column_is_the_versions_then_minus_one(versions: list[int], T: int) -> None:
    want = torch.tensor(versions + [-1] * (T - len(versions)), dtype=torch.int64)
    got = version_column(list(versions), T)
    assert got.dtype == torch.int64
    assert torch.equal(got, want)


def test_the_unchecked_tensordict_is_the_checked_one() -> None:
    B, T = 2, 3
    flat = {
        "observation": torch.randn(B, T, 4),
        ("next", "observation"): torch.randn(B, T, 4),
        ("next", "agents", "obs"): torch.randn(B, T, 5, 2),  # a level deeper
        ("collector", "traj_ids"): torch.arange(B * T).view(B, T),
    }
    names = [None, "time"]
    want = TensorDict(flat, batch_size=(B, T), names=names)
    got = _tree(TensorDict._new_unsafe, _nested(flat), torch.Size((B, T)), None, names)
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        assert got.get(key) is flat[key]  # the storage itself, not a copy
    for sub in ((), ("next",), ("next", "agents"), ("collector",)):
        g, w = (got.get(sub), want.get(sub)) if sub else (got, want)
        assert g.batch_size == w.batch_size
        assert g.names == w.names == names
        assert g.device == w.device
    assert not got.is_locked


def test_a_weight_update_mid_batch_shows_in_the_version_column() -> None:
    # The version column of a real batch, one version per step, across an update the policy
    # itself triggers halfway (as an update from another thread would land between steps).
    class Flip(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0
            self.net = torch.nn.Linear(4, 2)

        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            return self.net(obs).argmax(-1)

    policy = Flip()
    with SyncDataCollector(lambda: gym.make("CartPole-v1"), policy, frames_per_batch=10, total_frames=20) as c:
        adapter = c._async._policy  # internal: bump the version as an update would, mid-batch
        forward = policy.forward

        def bump(obs: torch.Tensor) -> torch.Tensor:
            if policy.calls == 4:
                adapter.version += 1
            return forward(obs)

        policy.forward = bump  # type: ignore[method-assign]
        batches = [b["collector", "policy_version"].clone() for b in c]
    first = batches[0]
    assert first.shape == (10,)
    assert len(set(first.tolist())) == 2  # both versions, in step order
    assert first.tolist() == sorted(first.tolist())
    assert len(set(batches[1].tolist())) == 1


def test_a_batch_on_a_storing_device_names_it_as_tensordict_does() -> None:
    # The unchecked constructor is handed the tensors' own (indexed) device, which is what the
    # checked one would name: "cuda" asked gives "cuda:0" on a GPU, "cpu" gives "cpu".
    with SyncDataCollector(lambda: gym.make("CartPole-v1"), None, frames_per_batch=10, total_frames=10,
                           storing_device="cpu") as c:  # fmt: skip
        (batch,) = list(c)
    want = TensorDict({}, batch_size=[], device="cpu").device
    assert batch.device == want
    for sub in ("next", "collector"):
        assert batch[sub].device == want
        assert batch[sub].names == batch.names == ["time"]
