"""Every constructor rule fails before any env is built, with rule, value and fix."""

from __future__ import annotations

import pytest
import torch

from aiocollect import Collector, SyncDataCollector
from aiocollect._errors import WorkerCrashedError, WorkerError


class Boom:
    built = 0

    def __call__(self) -> None:
        Boom.built += 1
        raise AssertionError("the env must not be built when arguments are invalid")


CASES = [
    ({"frames_per_batch": 0}, ValueError, r"^frames_per_batch must be a positive int, got 0$"),
    ({"frames_per_batch": 2.5}, TypeError, r"^frames_per_batch must be a positive int, got 2\.5$"),
    ({"frames_per_batch": True}, TypeError, r"^frames_per_batch must be a positive int, got True$"),
    ({"total_frames": 0}, ValueError, r"^total_frames must be positive, or -1 for endless collection, got 0$"),
    ({"total_frames": "10"}, TypeError, r"^total_frames must be an int \(-1 for endless\), got '10'$"),
    ({"max_frames_per_traj": 1.5}, TypeError, r"^max_frames_per_traj must be an int or None, got 1\.5$"),
    ({"init_random_frames": -5}, ValueError, r"^init_random_frames must be an int >= 0"),
    ({"reset_when_done": False}, ValueError, r"^reset_when_done must be True"),
    ({"exploration_type": "greedy"}, ValueError, r"^exploration_type must be a tensordict\.nn\.InteractionType"),
    ({"device": "gpu7"}, ValueError, r"^device must be a torch\.device or a device string"),
    ({"create_env_kwargs": [1]}, TypeError, r"^create_env_kwargs must be a dict or None, got \[1\]$"),
    ({"split_trajs": True, "track_traj_ids": False}, ValueError, r"^split_trajs=True needs track_traj_ids=True"),
    ({"max_queued_batches": -1}, ValueError, r"^max_queued_batches must be an int >= 0, got -1$"),
    ({"postproc": 3}, TypeError, r"^postproc must be a callable"),
    ({"set_truncated": "yes"}, TypeError, r"^set_truncated must be a bool, got 'yes'$"),
    ({"shutdown_timeout": 0}, ValueError, r"^shutdown_timeout must be a positive number of seconds, got 0$"),
]


@pytest.mark.parametrize("cls", [Collector, SyncDataCollector])
@pytest.mark.parametrize(("kwargs", "exc", "pattern"), CASES)
def test_bad_argument_is_rejected_before_env_creation(cls, kwargs, exc, pattern) -> None:
    args = {"frames_per_batch": 4, **kwargs}
    with pytest.raises(exc, match=pattern):
        cls(Boom(), **args)
    assert Boom.built == 0


def test_unknown_env_id_names_the_id() -> None:
    with pytest.raises(ValueError, match=r"^create_env_fn 'CartPol-v1' is not a registered gymnasium env id"):
        Collector("CartPol-v1", frames_per_batch=4)


def test_env_instance_with_kwargs_is_rejected() -> None:
    import gymnasium as gym

    env = gym.make("CartPole-v1")
    try:
        with pytest.raises(ValueError, match="create_env_kwargs can only be used with an env id or a factory"):
            Collector(env, frames_per_batch=4, create_env_kwargs={"render_mode": None})
    finally:
        env.close()


def test_not_an_env_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"^create_env_fn must be a gymnasium env id"):
        Collector(42, frames_per_batch=4)


def test_policy_must_be_callable() -> None:
    with pytest.raises(TypeError, match=r"^policy must be None, an nn\.Module or a callable, got 3$"):
        Collector("CartPole-v1", 3, frames_per_batch=4)


def test_worker_error_messages() -> None:
    err = WorkerError(3, 41237, 1052, "ValueError: observation has shape (3,), expected (4,)")
    assert str(err) == "worker 3 (pid 41237) failed at step 1052: ValueError: observation has shape (3,), expected (4,)"
    assert str(WorkerCrashedError(1, 7, -9)) == "worker 1 (pid 7) killed by SIGKILL"
    assert str(WorkerCrashedError(1, 7, 3)) == "worker 1 (pid 7) exited with code 3"


def test_set_seed_rejects_negative() -> None:
    c = Collector("CartPole-v1", frames_per_batch=4)
    with pytest.raises(ValueError, match=r"^seed must be a non-negative int, got -1$"):
        c.set_seed(-1)
    assert isinstance(c.set_seed(0), int)
    del c
    torch.manual_seed(0)
