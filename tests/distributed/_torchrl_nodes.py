"""What the TorchRL-env tests of the distributed collectors share: the env and the batch checks.

Each collector kind (torch.distributed, RPC, Ray) runs ``torchrl_pendulum`` on two nodes with
random actions; every node rebuilds the env from the factory, and the batches must carry
TorchRL's keys (a ``StepCounter``'s) and the collector's worker ids.
"""

from __future__ import annotations

from typing import Any

__all__ = ["check_torchrl_node_batches", "torchrl_pendulum"]


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
