"""Argument types and values: TypeError for a wrong type, ValueError for a wrong value, and
warnings that point at the user's line."""

from __future__ import annotations

import warnings
from typing import Any

import anyio
import pytest

from aiocollect import (
    Collector,
    MultiAsyncCollector,
    MultiSyncCollector,
    ReplayBuffer,
    SliceSampler,
    SyncDataCollector,
    blocking,
)
from aiocollect.testing import CountingEnv

COLLECTORS = [Collector, SyncDataCollector, MultiSyncCollector, MultiAsyncCollector]


def make(cls: type, **kwargs: Any) -> Any:
    if cls in (MultiSyncCollector, MultiAsyncCollector):
        kwargs = {"num_workers": 2, **kwargs}
    return cls(CountingEnv, **{"frames_per_batch": 8, **kwargs})


@pytest.mark.parametrize("cls", COLLECTORS)
def test_total_frames_below_one_batch_warns_that_one_batch_is_collected(cls: type) -> None:
    # TorchRL's rule: the budget is rounded up to whole batches, with a warning.
    with pytest.warns(UserWarning, match=(
        r"^total_frames \(4\) is not divisible by frames_per_batch \(8\); the last batch will take "
        r"collection to 8 frames$"
    )):  # fmt: skip
        c = make(cls, total_frames=4)
    assert len(c) == 1
    if isinstance(c, SyncDataCollector):  # built by its constructor
        c.shutdown()


WRONG_TYPES = [
    (
        MultiSyncCollector,
        {"num_workers": 2.0},
        r"^num_workers must be a positive int when create_env_fn is a single factory, got 2\.0$",
    ),
    (
        MultiAsyncCollector,
        {"num_workers": "2"},
        r"^num_workers must be a positive int when create_env_fn is a single factory, got '2'$",
    ),
    (MultiSyncCollector, {"restart_workers": 1.5}, r"^restart_workers must be an int >= 0, got 1\.5$"),
    (MultiSyncCollector, {"num_sub_threads": "1"}, r"^num_sub_threads must be a positive int, got '1'$"),
    (
        MultiSyncCollector,
        {"weight_sync_timeout": "60"},
        r"^weight_sync_timeout must be a positive number of seconds, got '60'$",
    ),
    (
        MultiSyncCollector,
        {"preemptive_threshold": "0.5"},
        r"^preemptive_threshold must be a float in \[0, 1\] or None, got '0\.5'$",
    ),
    (Collector, {"shutdown_timeout": "10"}, r"^shutdown_timeout must be a positive number of seconds, got '10'$"),
    (Collector, {"max_queued_batches": 1.0}, r"^max_queued_batches must be an int >= 0, got 1\.0$"),
    (
        Collector,
        {"init_random_frames": 10.0},
        r"^init_random_frames must be an int >= 0 \(or -1/None for none\), got 10\.0$",
    ),
    (Collector, {"trajs_per_batch": 1.5}, r"^trajs_per_batch must be a positive int or None, got 1\.5$"),
]


@pytest.mark.parametrize(("cls", "kwargs", "pattern"), WRONG_TYPES)
def test_a_wrong_type_is_a_type_error(cls: type, kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(TypeError, match=pattern):
        make(cls, **kwargs)


WRONG_VALUES = [
    (
        MultiSyncCollector,
        {"num_workers": 0},
        r"^num_workers must be a positive int when create_env_fn is a single factory, got 0$",
    ),
    (
        MultiSyncCollector,
        {"preemptive_threshold": 1.5},
        r"^preemptive_threshold must be a float in \[0, 1\] or None, got 1\.5$",
    ),
    (
        MultiSyncCollector,
        {"weight_sync_timeout": float("inf")},
        r"^weight_sync_timeout must be a positive number of seconds, got inf$",
    ),
]


@pytest.mark.parametrize(("cls", "kwargs", "pattern"), WRONG_VALUES)
def test_a_wrong_value_is_a_value_error(cls: type, kwargs: dict[str, Any], pattern: str) -> None:
    with pytest.raises(ValueError, match=pattern):
        make(cls, **kwargs)


@pytest.mark.parametrize("buffer_cls", [ReplayBuffer, blocking.ReplayBuffer])
@pytest.mark.parametrize(("kwargs", "exc", "pattern"), [
    ({"capacity": 2.5}, TypeError, r"^capacity must be a positive int, got 2\.5$"),
    ({"capacity": "100"}, TypeError, r"^capacity must be a positive int, got '100'$"),
    ({"capacity": 0}, ValueError, r"^capacity must be a positive int, got 0$"),
    ({"capacity": 100, "batch_size": 2.0}, TypeError, r"^batch_size must be a positive int or None, got 2\.0$"),
    ({"capacity": 100, "min_size": -1}, ValueError, r"^min_size must be an int >= 0, got -1$"),
    ({"capacity": 100, "samples_per_insert": "1"},
     TypeError, r"^samples_per_insert must be a positive number or None, got '1'$"),
    ({"capacity": 100, "samples_per_insert": 0},
     ValueError, r"^samples_per_insert must be a positive number or None, got 0$"),
    ({"capacity": 100, "seed": 1.5}, TypeError, r"^seed must be an int >= 0 or None, got 1\.5$"),
])  # fmt: skip
def test_replay_buffer_arguments(buffer_cls: type, kwargs: dict[str, Any], exc: type, pattern: str) -> None:
    with pytest.raises(exc, match=pattern):
        buffer_cls(**kwargs)


def test_set_seed_rejects_a_float_as_a_type_error() -> None:
    c = Collector(CountingEnv, frames_per_batch=4)
    with pytest.raises(TypeError, match=r"^seed must be a non-negative int, got 1\.5$"):
        c.set_seed(1.5)


# -- warnings point at the caller's line ---------------------------------------------------------


def _construct_warning(build: Any) -> warnings.WarningMessage:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build()
    (w,) = [w for w in caught if issubclass(w.category, UserWarning)]
    return w


@pytest.mark.parametrize("cls", COLLECTORS)
def test_the_budget_warning_points_at_the_constructor_call(cls: type) -> None:
    w = _construct_warning(lambda: make(cls, total_frames=20))
    assert str(w.message) == (
        "total_frames (20) is not divisible by frames_per_batch (8); the last batch will take collection to 24 frames"
    )
    assert w.filename == __file__  # this file's `make`, not aiocollect's or anyio's source


def test_the_budget_warning_points_at_the_users_line_under_anyio_run() -> None:
    async def main() -> None:
        Collector(CountingEnv, frames_per_batch=8, total_frames=20)

    w = _construct_warning(lambda: anyio.run(main))
    assert w.filename == __file__ and w.lineno == main.__code__.co_firstlineno + 1


def test_slice_sampler_arguments_have_types() -> None:
    with pytest.raises(TypeError, match=r"^slice_len must be"):
        SliceSampler(slice_len=2.5)
