"""Replay-buffer waits that can never be served end with an account, and ``timeout=`` bounds any wait.

A buffer knows the collectors writing into it. Once every one has ended (budget spent, shut
down or failed), a ``sample()`` or ``wait_for()`` that the stored frames cannot serve raises
`BufferStarvedError` instead of waiting forever; ``timeout=`` raises `BufferTimeoutError` (a
`TimeoutError`). Both messages say what the call waited for, what the buffer holds, and who
writes (or wrote) into it.
"""

from __future__ import annotations

import re

import anyio
import pytest
import torch
from tensordict import TensorDict

from aiocollect import (
    BufferStarvedError,
    BufferTimeoutError,
    Collector,
    MultiAsyncCollector,
    ReplayBuffer,
    SliceSampler,
    blocking,
)
from aiocollect.testing import CountingEnv, FailingEnv

pytestmark = pytest.mark.timeout(60)


def frames(start: int, n: int) -> TensorDict:
    return TensorDict(observation=torch.arange(start, start + n, dtype=torch.float32), batch_size=[n])


async def _sampler_error(rb: ReplayBuffer, started: anyio.Event, box: list[BaseException], **kw: object) -> None:
    started.set()
    try:
        await rb.sample(**kw)  # type: ignore[arg-type]
    except Exception as exc:  # the test inspects it
        box.append(exc)


# -- starvation: every writer has ended ------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.all_backends
async def test_a_sample_waiting_when_the_budget_runs_out_gets_the_account() -> None:
    # The reported case: learning_starts (min_size) above the collector's total_frames.
    rb = ReplayBuffer(10_000, batch_size=8, min_size=5_000)
    box: list[BaseException] = []
    with anyio.fail_after(30):
        async with Collector(lambda: CountingEnv(2), frames_per_batch=64, total_frames=256, replay_buffer=rb) as c:
            async with anyio.create_task_group() as tg:
                started = anyio.Event()
                tg.start_soon(_sampler_error, rb, started, box)
                await started.wait()
                c.start()  # the sampler is already waiting when the budget runs out
    [err] = box
    assert isinstance(err, BufferStarvedError) and isinstance(err, RuntimeError)
    assert str(err) == (
        "sample() can never return: it waits for min_size=5000 frames to be written, the buffer holds 256 frames "
        "(256 written, 0 sampled), and no collector writes into it any more (Collector spent its frame budget of "
        "256 frames); lower min_size (a trainer's learning_starts) below the frames the collectors write, or raise "
        "their total_frames"
    )
    assert err.__cause__ is None
    # A later call is refused at once, and so is wait_for.
    with anyio.fail_after(5):
        with pytest.raises(BufferStarvedError, match=r"^sample\(\) can never return: it waits for min_size=5000"):
            await rb.sample()
        with pytest.raises(BufferStarvedError, match=r"^wait_for\(300\) can never return: it waits for 300 stored"):
            await rb.wait_for(300)
        await rb.wait_for(256)  # what the buffer holds is still served
        assert len(rb) == 256


@pytest.mark.anyio
async def test_a_collector_shut_down_early_is_named_as_such() -> None:
    rb = ReplayBuffer(1_000, batch_size=8, min_size=500)
    with anyio.fail_after(30):
        async with Collector(lambda: CountingEnv(1), frames_per_batch=16, replay_buffer=rb) as c:
            async for _ in c:  # endless collector, left after two batches
                if rb.write_count >= 32:
                    break
        with pytest.raises(BufferStarvedError) as info:
            await rb.sample()
    assert "no collector writes into it any more (Collector was shut down after 32 frames)" in str(info.value)


@pytest.mark.anyio
async def test_a_failed_collector_is_the_cause() -> None:
    rb = ReplayBuffer(1_000, batch_size=8, min_size=500)
    box: list[BaseException] = []
    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            started = anyio.Event()
            tg.start_soon(_sampler_error, rb, started, box)
            await started.wait()
            with pytest.raises(ValueError, match=r"^FailingEnv failed at step 5$"):
                async with Collector(lambda: FailingEnv(1, fail_at=5), frames_per_batch=2, replay_buffer=rb) as c:
                    async for _ in c:  # the env's error reaches the loop, then the collector closes
                        pass
    [err] = box
    assert isinstance(err, BufferStarvedError)
    assert "(Collector failed with ValueError: FailingEnv failed at step 5)" in str(err)
    assert isinstance(err.__cause__, ValueError) and str(err.__cause__) == "FailingEnv failed at step 5"


@pytest.mark.anyio
async def test_only_when_every_writer_has_ended() -> None:
    # Two collectors feed the buffer; the first one ending leaves the sampler waiting.
    rb = ReplayBuffer(1_000, batch_size=4, min_size=100)
    with anyio.fail_after(30):
        async with Collector(lambda: CountingEnv(1), frames_per_batch=8, total_frames=16, replay_buffer=rb) as one:
            async with Collector(lambda: CountingEnv(1), frames_per_batch=8, total_frames=24, replay_buffer=rb) as two:
                one.start()
                await one.wait_finished()
                with pytest.raises(BufferTimeoutError) as info:
                    await rb.sample(timeout=0.05)
                assert "1 collector still writes into it (Collector)" in str(info.value)
                two.start()
                with pytest.raises(BufferStarvedError) as starved:
                    await rb.sample()
    assert "(Collector spent its frame budget of 16 frames; Collector spent its frame budget of 24 frames)" in str(
        starved.value
    )


@pytest.mark.anyio
async def test_a_whole_slice_that_can_never_be_stored() -> None:
    rb = ReplayBuffer(1_000, batch_size=8, sampler=SliceSampler(slice_len=8), min_size=1)
    with anyio.fail_after(30):
        # Episodes of 3 steps: no trajectory ever holds a whole slice of 8.
        async with Collector(
            lambda: CountingEnv(1, episode_length=3), frames_per_batch=6, total_frames=12, replay_buffer=rb
        ) as c:
            c.start()
            with pytest.raises(
                BufferStarvedError, match=r"it waits for frames its SliceSampler can return \(8 asked\)"
            ):
                await rb.sample()


@pytest.mark.anyio
async def test_a_buffer_no_collector_registered_with_keeps_waiting() -> None:
    # Frames may still come from the user's own extend() calls: the buffer cannot tell.
    rb = ReplayBuffer(100, batch_size=4, min_size=10)
    await rb.extend(frames(0, 4))
    with anyio.fail_after(5):
        with pytest.raises(BufferTimeoutError) as info:
            await rb.sample(timeout=0.05)
    assert str(info.value) == (
        "sample() timed out after 0.05s waiting for min_size=10 frames to be written; the buffer holds 4 frames "
        "(4 written, 0 sampled) and no collector has registered with it (pass it to a collector as replay_buffer=)"
    )


@pytest.mark.timeout(120)
@pytest.mark.anyio
async def test_worker_processes_spending_their_budget_end_the_wait() -> None:
    rb = ReplayBuffer(10_000, batch_size=8, min_size=5_000, storage="shared")
    with anyio.fail_after(90):
        async with MultiAsyncCollector(
            [lambda: CountingEnv(2)] * 2, frames_per_batch=32, total_frames=128, replay_buffer=rb
        ) as c:
            c.start()
            with pytest.raises(BufferStarvedError, match=r"MultiAsyncCollector spent its frame budget of 128 frames"):
                await rb.sample()
    await rb.aclose()


def test_blocking_twin_is_told_too() -> None:
    with blocking.ReplayBuffer(1_000, batch_size=4, min_size=500) as rb:
        with blocking.Collector(lambda: CountingEnv(1), frames_per_batch=8, total_frames=32, replay_buffer=rb) as c:
            c.start()
            with pytest.raises(BufferStarvedError, match=r"^sample\(\) can never return: it waits for min_size=500"):
                rb.sample()
            with pytest.raises(BufferStarvedError, match=r"^wait_for\(64\) can never return"):
                rb.wait_for(64)


# -- timeout= --------------------------------------------------------------------------------------
@pytest.mark.anyio
@pytest.mark.all_backends
async def test_sample_timeout_names_the_rate_limiter_that_holds_it() -> None:
    rb = ReplayBuffer(1_000, batch_size=4, samples_per_insert=0.5, tolerance=4)
    await rb.extend(frames(0, 8))
    for _ in range(2):  # 8 sampled for 8 inserted: a tolerance (4) ahead of 0.5, so the next sample is held
        await rb.sample()
    with anyio.fail_after(5):
        with pytest.raises(TimeoutError) as info:
            await rb.sample(timeout=0.05)
    assert isinstance(info.value, BufferTimeoutError)
    assert str(info.value) == (
        "sample() timed out after 0.05s waiting for the rate limiter (samples_per_insert=0.5, tolerance 4 frames) "
        "to allow a sample; the buffer holds 8 frames (8 written, 8 sampled) and no collector has registered "
        "with it (pass it to a collector as replay_buffer=)"
    )
    await rb.extend(frames(8, 8))
    assert (await rb.sample(timeout=5)).shape == (4,)  # served well before its timeout


@pytest.mark.anyio
async def test_wait_for_timeout_and_a_timeout_that_is_not_reached() -> None:
    rb = ReplayBuffer(100, batch_size=4)
    with anyio.fail_after(5):
        with pytest.raises(BufferTimeoutError, match=r"^wait_for\(10\) timed out after 0.05s waiting for 10 stored"):
            await rb.wait_for(10, timeout=0.05)

        async def writer() -> None:
            await rb.extend(frames(0, 10))

        async with anyio.create_task_group() as tg:
            tg.start_soon(writer)
            await rb.wait_for(10, timeout=5)


def test_blocking_twin_timeouts() -> None:
    with blocking.ReplayBuffer(100, batch_size=4, min_size=8) as rb:
        rb.extend(frames(0, 4))
        with pytest.raises(BufferTimeoutError, match=r"^sample\(\) timed out after 0.05s waiting for min_size=8"):
            rb.sample(timeout=0.05)
        with pytest.raises(BufferTimeoutError, match=r"^wait_for\(6\) timed out after 0.05s"):
            rb.wait_for(6, timeout=0.05)


@pytest.mark.anyio
async def test_bad_timeouts_are_refused_with_the_rule() -> None:
    rb = ReplayBuffer(100, batch_size=4)
    rule = "timeout must be a positive number of seconds or None, got"
    with pytest.raises(ValueError, match=re.escape(f"{rule} 0; call sample_nowait() not to wait at all")):
        await rb.sample(timeout=0)
    with pytest.raises(TypeError, match=re.escape(f"{rule} '1'")):
        await rb.sample(timeout="1")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=re.escape(f"{rule} -1")):
        await rb.wait_for(1, timeout=-1)
