"""A policy trained in place whose weights never reach the workers is reported, once, when collection ends.

TorchRL's CPU workers read the trainer's parameters live, so a TorchRL script may never call
``update_policy_weights_()``; aiocollect's workers hold copies. Such a script must not collect
with its first weights in silence (`aiocollect.StaleWeightsWarning`), and a script that does
sync, on any schedule, must not be warned.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest
import torch

from aiocollect import Collector, MultiAsyncCollector, MultiSyncCollector, StaleWeightsWarning, blocking
from aiocollect._collect._inplace import InPlaceWatch
from aiocollect.testing import CountingEnv

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(120)]

VERSION = ("collector", "policy_version")


class Linear(torch.nn.Module):
    """``action = obs.sum(-1) * weight > 0``; ``scale`` is a buffer a trainer may change too."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(()))
        self.register_buffer("scale", torch.ones(()))

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        return (observation.sum(-1) * self.weight * self.scale > 0).long()


def env() -> CountingEnv:
    return CountingEnv(2, episode_length=4)


def sgd_step(policy: Linear) -> None:
    policy.weight.grad = torch.ones(())
    torch.optim.SGD(policy.parameters(), lr=0.1).step()


def data_write(policy: Linear) -> None:
    policy.weight.data += 1  # through .data: no version counter moves, the values do


def fused_adam_step(policy: Linear) -> None:
    policy.weight.grad = torch.ones(())
    torch.optim.Adam(policy.parameters(), lr=0.1, fused=True).step()


def buffer_write(policy: Linear) -> None:
    with torch.no_grad():
        policy.scale.mul_(2)


def tensor_swap(policy: Linear) -> None:
    policy.weight = torch.nn.Parameter(torch.full((), 3.0))  # a new tensor: only its values tell


@contextmanager
def no_stale_warning() -> Iterator[None]:
    with warnings.catch_warnings():
        warnings.simplefilter("error", StaleWeightsWarning)
        yield


# -- the watch itself (no processes) ---------------------------------------------------------------
# torch.__version__ is a TorchVersion: it compares with a version string.
_FUSED_ON_CPU = pytest.mark.skipif(torch.__version__ < "2.4", reason="fused Adam runs on the CPU from torch 2.4")


@pytest.mark.parametrize(
    "change", [sgd_step, data_write, pytest.param(fused_adam_step, marks=_FUSED_ON_CPU), buffer_write, tensor_swap]
)
async def test_every_kind_of_in_place_change_is_seen_by_the_second_batch(change: Callable[[Linear], None]) -> None:
    policy = Linear()
    watch = InPlaceWatch("X", policy, {k: v.clone() for k, v in policy.state_dict().items()}, holder="its workers")
    await watch.before_batch()
    change(policy)
    await watch.before_batch()
    await watch.before_batch()
    assert watch.stale_batches == 2
    with pytest.warns(StaleWeightsWarning, match=r"^X collected 2 batch\(es\) after the policy's weights changed"):
        watch.report()


async def test_forward_passes_and_an_unchanged_policy_are_not_changes() -> None:
    policy = Linear()
    watch = InPlaceWatch("X", policy, {k: v.clone() for k, v in policy.state_dict().items()}, holder="its workers")
    for _ in range(9):  # content checks at 1, 2, 4 and 8 among them
        policy(torch.ones(3, 2)).sum()
        policy.train()
        await watch.before_batch()
    assert watch.stale_batches == 0
    with no_stale_warning():
        watch.report()


async def test_without_a_copy_of_the_weights_version_counters_still_see_an_optimizer() -> None:
    policy = Linear()
    watch = InPlaceWatch("X", policy, None, holder="its workers")
    data_write(policy)  # invisible without a copy to compare with
    await watch.before_batch()
    assert watch.stale_batches == 0
    sgd_step(policy)
    await watch.before_batch()
    assert watch.stale_batches == 1


# -- worker collectors ------------------------------------------------------------------------------
@pytest.mark.parametrize("collector_class", [MultiSyncCollector, MultiAsyncCollector])
async def test_training_in_place_without_an_update_is_reported_when_collection_ends(collector_class: Any) -> None:
    policy = Linear()
    with anyio.fail_after(60), pytest.warns(StaleWeightsWarning) as record:
        async with collector_class([env, env], policy, frames_per_batch=8, total_frames=8 * 4) as c:
            async for batch in c:
                assert (batch[VERSION] == 0).all()
                sgd_step(policy)
    (warning,) = record
    message = str(warning.message)
    assert message.startswith(f"{collector_class.__name__} collected 3 batch(es) after the policy's weights changed")
    assert "its workers collected all of them with the first weights" in message
    assert "call collector.update_policy_weights_() after each optimizer step" in message
    assert "update_at_each_batch=True" in message


async def test_the_workers_really_collected_with_the_first_weights() -> None:
    # What the warning says is what happened: weight -1 would act the other way round.
    policy = Linear()
    with anyio.fail_after(60), pytest.warns(StaleWeightsWarning):
        async with MultiSyncCollector([env, env], policy, frames_per_batch=8, total_frames=8 * 3) as c:
            async for batch in c:
                positive = batch["observation"].sum(-1) > 0
                assert positive.any()
                assert torch.equal(batch["action"], positive.long())  # weight +1, the first
                with torch.no_grad():
                    policy.weight.fill_(-1.0)


async def test_an_update_on_any_schedule_ends_the_watch() -> None:
    # DQN-style: learner steps every batch, weights sent every third one. Not a mistake.
    policy = Linear()
    with anyio.fail_after(60), no_stale_warning():
        async with MultiAsyncCollector([env, env], policy, frames_per_batch=8, total_frames=8 * 6) as c:
            i = 0
            async for _ in c:
                sgd_step(policy)
                i += 1
                if i == 3:
                    await c.update_policy_weights_()
    assert c.policy_version == 1


async def test_update_at_each_batch_and_an_untrained_policy_are_not_warned() -> None:
    policy = Linear()
    with anyio.fail_after(60), no_stale_warning():
        async with MultiSyncCollector(
            [env, env], policy, frames_per_batch=8, total_frames=8 * 3, update_at_each_batch=True
        ) as c:
            async for _ in c:
                sgd_step(policy)
        async with MultiSyncCollector([env, env], Linear(), frames_per_batch=8, total_frames=8 * 3) as c:
            async for _ in c:
                pass


async def test_a_collection_that_failed_adds_no_warning_to_its_error() -> None:
    policy = Linear()
    with anyio.fail_after(60), no_stale_warning(), pytest.raises(ZeroDivisionError):
        async with MultiSyncCollector([env, env], policy, frames_per_batch=8, total_frames=-1) as c:
            async for _ in c:
                sgd_step(policy)
                if c.stats().batches == 3:
                    raise ZeroDivisionError


def test_an_error_in_the_loop_body_is_not_replaced_by_the_warning() -> None:
    # Under -W error (as here) the warning is an exception raised while closing: the body's
    # error must still be the one that propagates, with the warning noted on it.
    policy = Linear()
    with no_stale_warning(), pytest.raises(KeyError, match="the body's own") as raised:
        with blocking.MultiSyncCollector([env, env], policy, frames_per_batch=8, total_frames=-1) as c:
            for i, _ in enumerate(c):
                sgd_step(policy)
                if i == 2:
                    raise KeyError("the body's own")
    notes = getattr(raised.value, "__notes__", [])
    assert any("StaleWeightsWarning" in note for note in notes), notes


def test_the_blocking_twin_warns_when_its_frames_run_out_as_a_torchrl_script_runs_it() -> None:
    policy = Linear()
    c = blocking.MultiSyncCollector([env, env], policy, frames_per_batch=8, total_frames=8 * 3)
    try:
        with pytest.warns(StaleWeightsWarning, match=r"^MultiSyncCollector collected 2 batch\(es\)") as record:
            for _ in c:
                sgd_step(policy)
    finally:
        c.shutdown()
    assert len(record) == 1


def test_the_blocking_twin_warns_at_shutdown_after_a_break() -> None:
    policy = Linear()
    c = blocking.MultiSyncCollector([env, env], policy, frames_per_batch=8, total_frames=-1)
    try:
        for i, _ in enumerate(c):
            sgd_step(policy)
            if i == 2:
                break
    finally:
        with pytest.warns(StaleWeightsWarning, match=r"^MultiSyncCollector collected 2 batch\(es\)"):
            c.shutdown()


def test_a_change_between_construction_and_the_first_batch_is_seen_at_the_first_batch() -> None:
    # The blocking twin ships its weights when it is built; a script that then loads weights
    # through ``.data`` (no version counter moves) has stale workers from the first batch on,
    # which only the first batch's value check can tell.
    policy = Linear()
    c = blocking.MultiSyncCollector([env, env], policy, frames_per_batch=8, total_frames=8)
    try:
        data_write(policy)
        with pytest.warns(StaleWeightsWarning, match=r"^MultiSyncCollector collected 1 batch\(es\)"):
            for batch in c:
                assert (batch[VERSION] == 0).all()
    finally:
        c.shutdown()


# -- in process: the policy is the trainer's own module -------------------------------------------
async def test_an_in_process_collector_runs_the_live_module_and_does_not_warn() -> None:
    policy = Linear()
    with anyio.fail_after(60), no_stale_warning():
        async with Collector(env, policy, frames_per_batch=8, total_frames=8 * 3) as c:
            async for batch in c:
                # Live: every batch acts with the weight the trainer set before asking for it.
                assert torch.equal(batch["action"], policy(batch["observation"]))
                sgd_step(policy)
