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

    def env_fn() -> gym.vector.VectorEnv:
        return gym.make_vec("CartPole-v1", 3, vectorization_mode="sync")

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


def test_torchrl_split_trajectories_splits_slice_samples_by_slice_ids() -> None:
    from tensordict import TensorDict
    from torchrl.collectors.utils import split_trajectories

    from aiocollect import SliceSampler, blocking

    obs = torch.arange(7.0)
    traj = torch.tensor([1, 1, 2, 2, 2, 2, 2])  # trajectory 1 is shorter than a slice
    data = TensorDict({"observation": obs, ("collector", "traj_ids"): traj}, batch_size=[7])
    sampler = SliceSampler(slice_len=4, strict_length=False)
    with blocking.ReplayBuffer(20, batch_size=12, sampler=sampler, seed=0) as rb:
        rb.extend(data)
        for _ in range(10):
            batch = rb.sample()
            rows = split_trajectories(batch, trajectory_key=("collector", "slice_ids"))
            assert rows.shape[0] == 3  # one row per slice, even for adjacent slices of trajectory 2
            for row, mask in zip(rows["observation"], rows["collector", "mask"], strict=True):
                real = row[mask]
                assert torch.equal(real - real[0], torch.arange(float(real.numel())))
                assert real.tolist() in ([0.0, 1.0], [2.0, 3.0, 4.0, 5.0], [3.0, 4.0, 5.0, 6.0])
