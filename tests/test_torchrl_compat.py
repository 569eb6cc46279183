"""TorchRL consumes aiocollect batches unchanged (torchrl is an optional test dependency)."""

from __future__ import annotations

import pytest
import torch
from tensordict.nn import TensorDictModule

from aiocollect import SyncDataCollector

torchrl_value = pytest.importorskip("torchrl.objectives.value")


def test_gae_runs_on_a_batch_unchanged() -> None:
    import gymnasium as gym

    value_net = TensorDictModule(torch.nn.Linear(4, 1), in_keys=["observation"], out_keys=["state_value"])
    gae = torchrl_value.GAE(gamma=0.99, lmbda=0.95, value_network=value_net)
    env_fn = lambda: gym.make_vec("CartPole-v1", 3, vectorization_mode="sync")  # noqa: E731
    with SyncDataCollector(env_fn, frames_per_batch=96, total_frames=96) as c:
        batch = next(c)
    out = gae(batch)
    assert out["advantage"].shape == (3, 32, 1)
    assert out["value_target"].shape == (3, 32, 1)
    assert torch.isfinite(out["advantage"]).all()
    # On terminal frames the target is the reward alone (no bootstrap through the reset).
    done = out["next", "terminated"].squeeze(-1)
    if done.any():
        torch.testing.assert_close(out["value_target"][done], out["next", "reward"][done])
