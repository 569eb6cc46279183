"""Policies for the weight-update tests of worker processes and distributed nodes.

Workers and nodes unpickle them by reference, so they live in a module of their own
(importable there: worker and node processes get the test process's path).

* `VersionEcho` writes its weight's first and last entry into every frame: a batch shows which
  weights collected it, and whether they were one whole version.
* `HangsWhenLoading` hangs when a worker or node loads new weights into it.
* `DeviceEcho` acts as `aiocollect.testing.ScriptedPolicy` and writes where its forward ran.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import anyio
import torch
from tensordict import TensorDict

__all__ = ["DeviceEcho", "HangsWhenLoading", "VersionEcho", "check_updates_back_to_back"]

VERSION, WORKER_ID = ("collector", "policy_version"), ("collector", "worker_id")


class VersionEcho(torch.nn.Module):
    """Writes the first and last entry of its weight into every frame, as ``"seen"``."""

    def __init__(self, value: float = 0.0, size: int = 1 << 20) -> None:
        # Large by default: a copy long enough for a reader and a writer to overlap.
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((size,), float(value)))

    def forward(self, td: TensorDict) -> TensorDict:
        lead = td["observation"].shape[:-1]
        td["action"] = torch.zeros(lead, dtype=torch.int64)
        td["seen"] = torch.stack([self.w[0], self.w[-1]]).expand(*lead, 2).clone()
        return td


class DeviceEcho(torch.nn.Module):
    """``action = (obs.sum(-1) * weight) > 0``, and ``"ran_on"``: the CUDA index its forward ran on (-1: the host)."""

    def __init__(self, weight: float = 1.0) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(float(weight)))

    def forward(self, td: TensorDict) -> TensorDict:
        obs = td["observation"]
        td["action"] = ((obs.sum(-1) * self.weight) > 0).long()
        where = (obs.device.index or 0) if obs.is_cuda and self.weight.is_cuda else -1
        td["ran_on"] = torch.full(obs.shape[:-1], where, dtype=torch.int64, device=obs.device)
        return td


class HangsWhenLoading(torch.nn.Module):
    """action = 1; loading weights into it hangs for a minute, in a worker or node process only.

    A worker loads through ``state_dict()`` (its tensors are copied into), a node's collector
    through ``load_state_dict``: both hang outside the process that built the policy.
    """

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(1.0))
        self.owner = os.getpid()

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return torch.ones(observation.shape[:-1], dtype=torch.int64)

    def _hang_if_remote(self) -> None:
        if os.getpid() != self.owner:
            threading.Event().wait(60)  # stuck loading: shutdown ends the process

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        self._hang_if_remote()
        return super().state_dict(*args, **kwargs)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._hang_if_remote()
        super()._load_from_state_dict(*args, **kwargs)


async def check_updates_back_to_back(cls: type, env: Any, **kwargs: Any) -> None:
    """Updates that follow each other faster than the nodes load them (each loads between its
    batches): every frame's weights are one whole version, the version its batch names.

    ``cls``: a distributed collector class, run with ``sync=False`` on two nodes of ``env``.
    """
    last, size = 8, 1 << 18
    with anyio.fail_after(90):
        policy = VersionEcho(0.0, size)
        async with cls([env] * 2, policy, frames_per_batch=20, total_frames=-1, sync=False, **kwargs) as c:
            newest = {0: 0, 1: 0}
            version = 0
            while min(newest.values()) < last:
                for _ in range(2 if version < last else 0):  # two at a time: the trainer runs ahead
                    version += 1
                    await c.update_policy_weights_(VersionEcho(float(version), size))
                batch = await c.__anext__()
                (w,) = batch[WORKER_ID].unique().tolist()
                (named,) = batch[VERSION].unique().tolist()  # one version per batch
                assert (batch["seen"] == float(named)).all(), (named, batch["seen"].unique())
                assert named >= newest[w]  # a node never goes back to older weights
                newest[w] = named
