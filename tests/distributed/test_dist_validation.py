"""Bad arguments of the distributed collectors fail in the constructor, before anything starts.

Each case names the rule, the value and the fix; the autouse fixtures check that no process,
thread or socket was left behind (nothing was started), and the test checks no port was
opened either.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import psutil
import pytest
import torch.distributed as dist

from aiocollect import DistributedCollector, DistributedSyncCollector
from aiocollect.testing import CountingEnv

ENV = partial(CountingEnv, 1)
TWO = [ENV, ENV]

CASES: list[tuple[type, dict[str, Any], type, str]] = [
    (DistributedCollector, {"frames_per_batch": 41, "sync": True},
     ValueError, "frames_per_batch=41 must split evenly across 2 nodes when every node's share is gathered; "
                 "use a multiple of 2, e.g. 42"),
    (DistributedSyncCollector, {"frames_per_batch": 41},
     ValueError, "frames_per_batch=41 must split evenly across 2 nodes"),
    (DistributedCollector, {"launcher": "slurm"},
     ValueError, "launcher must be one of 'mp', 'submitit', 'external', 'ray', 'submitit_delayed', got 'slurm'"),
    (DistributedCollector, {"ray_init_config": {"num_cpus": 1}},
     ValueError, "ray_init_config is only for launcher='ray', got launcher='mp'"),
    (DistributedCollector, {"launcher": "ray", "remote_configs": [{}] * 3},
     ValueError, "remote_configs lists 3 dicts for 2 nodes; give one per node"),
    (DistributedCollector, {"launcher": "ray", "remote_configs": {"max_retries": 2}},
     ValueError, "remote_configs sets 'max_retries', which the launcher sets (a node task is never retried by Ray"),
    (DistributedCollector, {"launcher": "ray", "remote_configs": {"num_cpu": 1}},
     ValueError, "remote_configs {'num_cpu': 1} are not valid Ray task options: Invalid option keyword num_cpu"),
    (DistributedCollector, {"launcher": "ray", "remote_configs": ["x", "y"]},
     TypeError, "remote_configs must be a dict of Ray task options (or one per node) or None, got ['x', 'y']"),
    (DistributedCollector, {"backend": "ucc"}, ValueError, "backend must be one of 'gloo', 'nccl', 'mpi', got 'ucc'"),
    (DistributedCollector, {"update_after_each_batch": True, "max_weight_update_interval": 2},
     ValueError, "update_after_each_batch=True and max_weight_update_interval > -1 contradict each other"),
    (DistributedCollector, {"collector_kwargs": {"frames_per_batch": 3}},
     ValueError, "collector_kwargs sets 'frames_per_batch', which the distributed collector sets for each node; "
                 "pass it to DistributedCollector"),
    (DistributedCollector, {"collector_kwargs": [{}]},
     ValueError, "collector_kwargs lists 1 dicts for 2 nodes; give one per node"),
    (DistributedCollector, {"num_workers_per_collector": 2},
     ValueError, "num_workers_per_collector=2 needs collector_class=MultiSyncCollector or MultiAsyncCollector"),
    (DistributedCollector, {"collector_class": object}, TypeError, "collector_class must be aiocollect's Collector"),
    (DistributedCollector, {"num_nodes": 3},
     ValueError, "num_nodes=3 but create_env_fn lists 2 factories; drop num_nodes"),
    (DistributedCollector, {"create_env_fn": ENV},
     TypeError, "num_nodes must be a positive int when create_env_fn is a single factory"),
    (DistributedCollector, {"create_env_fn": []}, ValueError, "create_env_fn must list at least one env factory"),
    (DistributedCollector, {"tcp_port": 70000},
     ValueError, "tcp_port must be an int in [1, 65535] or None (any free port), got 70000"),
    (DistributedCollector, {"tcp_port": "x"},
     TypeError, "tcp_port must be an int in [1, 65535] or None (any free port), got 'x'"),
    (DistributedCollector, {"launcher": "external"},
     ValueError, "launcher='external' needs a known port for nodes to reach: pass tcp_port=29500"),
    (DistributedCollector, {"node_hosts": ["127.0.0.2"]},
     ValueError, "node_hosts lists 1 addresses for 2 nodes; give one per node"),
    (DistributedCollector, {"sync": "yes"}, TypeError, "sync must be a bool, got 'yes'"),
    (DistributedCollector, {"max_weight_update_interval": -2},
     ValueError, "max_weight_update_interval must be an int >= -1, got -2"),
    (DistributedCollector, {"join_timeout": 0},
     ValueError, "join_timeout must be a positive number of seconds, got 0"),
    (DistributedCollector, {"start_method": "fork"}, ValueError, "start_method must be 'forkserver' or 'spawn'"),
    (DistributedCollector, {"frames_per_batch": 0}, ValueError, "frames_per_batch must be a positive int, got 0"),
]  # fmt: skip


@pytest.mark.parametrize(("cls", "kwargs", "error", "message"), CASES, ids=[f"{i}" for i in range(len(CASES))])
def test_bad_arguments_fail_in_the_constructor(
    monkeypatch: pytest.MonkeyPatch, cls: type, kwargs: dict[str, Any], error: type, message: str
) -> None:
    monkeypatch.delenv("MASTER_PORT", raising=False)
    args = {"create_env_fn": TWO, "policy": None, "frames_per_batch": 8, "launcher": "mp", **kwargs}
    before = psutil.Process().net_connections(kind="inet")
    with pytest.raises(error) as info:
        cls(**args)
    assert str(info.value).startswith(message), str(info.value)
    assert psutil.Process().net_connections(kind="inet") == before  # no store, no listener


@pytest.mark.skipif(dist.is_mpi_available(), reason="this torch build has MPI: the other message applies")
def test_mpi_without_an_mpi_build_says_so() -> None:
    with pytest.raises(
        RuntimeError, match=r"^backend='mpi' needs a torch build with MPI, and this one has none; use backend='gloo'"
    ):
        DistributedCollector(TWO, None, frames_per_batch=8, launcher="mp", backend="mpi")


def test_nccl_without_cuda_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # the rule, on any machine
    with pytest.raises(
        RuntimeError, match=r"^backend='nccl' needs CUDA and a torch build with NCCL; use backend='gloo'"
    ):
        DistributedCollector(TWO, None, frames_per_batch=8, launcher="mp", backend="nccl")


def _fake_gpus(monkeypatch: pytest.MonkeyPatch, count: int, current: int = 0) -> None:
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(dist, "is_nccl_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current)


def test_nccl_with_local_nodes_on_one_gpu_is_refused_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_gpus(monkeypatch, 1)  # NCCL cannot pair the trainer and a node on one GPU (it errors, or hangs)
    with pytest.raises(ValueError, match=r"^backend='nccl' with launcher='mp' needs at least 2 GPUs .* has 1; use "):
        DistributedCollector(TWO, None, frames_per_batch=8, launcher="mp", backend="nccl")


@pytest.mark.parametrize(("count", "current", "gpus"), [(2, 0, [1, 1, 1]), (3, 0, [1, 2, 1]), (3, 1, [0, 2, 0])])
def test_local_nodes_take_gpus_other_than_the_trainers(
    monkeypatch: pytest.MonkeyPatch, count: int, current: int, gpus: list[int]
) -> None:
    from aiocollect._workers._distributed_options import local_node_gpu

    _fake_gpus(monkeypatch, count, current)
    assert [local_node_gpu(rank) for rank in (1, 2, 3)] == gpus


def test_sync_false_takes_any_frames_per_batch_per_node() -> None:
    c = DistributedCollector(TWO, None, frames_per_batch=41, launcher="mp")  # each node's batch is 41 frames
    assert c._dc.node_fpb == 41
