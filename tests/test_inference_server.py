"""InferenceServer: dynamic batches, answers routed to their callers, versions, errors, shutdown."""

from __future__ import annotations

import sys
import threading
from typing import Any

import anyio
import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from aiocollect import InferenceError, InferenceServer, InferenceServerClosedError, PolicyOutputError

if sys.version_info < (3, 11):
    from exceptiongroup import ExceptionGroup

pytestmark = [pytest.mark.anyio, pytest.mark.all_backends]


class Scale(torch.nn.Module):
    """action = observation * weight: each answer names the request it belongs to."""

    def __init__(self, weight: float = 2.0) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.tensor(weight))
        self.batch_sizes: list[int] = []

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.batch_sizes.append(obs.shape[0])
        return obs * self.weight


class Gate(Scale):
    """A `Scale` whose forward waits for ``release`` (set ``entered`` first): a forward in progress."""

    def __init__(self) -> None:
        super().__init__()
        self.entered, self.release = threading.Event(), threading.Event()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        self.entered.set()
        assert self.release.wait(30), "the test never released the forward pass"
        return super().forward(obs)


async def ask_all(server: InferenceServer, requests: list[Any]) -> list[Any]:
    answers: list[Any] = [None] * len(requests)

    async def one(i: int) -> None:
        answers[i] = await server(requests[i])

    async with anyio.create_task_group() as tg:
        for i in range(len(requests)):
            tg.start_soon(one, i)
    return answers


async def entered(event: threading.Event) -> None:
    """Wait until a policy's forward (on the server's thread) set ``event``."""
    while not event.is_set():  # noqa: ASYNC110  (a thread's event: no loop primitive to await)
        await anyio.sleep(0.001)


async def test_each_caller_gets_its_own_row_in_batches_of_at_most_max_batch_size() -> None:
    policy = Scale(3.0)
    with anyio.fail_after(30):
        async with InferenceServer(policy, max_batch_size=8) as server:
            answers = await ask_all(server, [{"observation": torch.full((2,), float(i))} for i in range(40)])
            stats = server.stats()
    for i, a in enumerate(answers):
        assert torch.equal(a["action"], torch.full((2,), 3.0 * i))
        assert torch.equal(a["observation"], torch.full((2,), float(i)))  # the request's entries too
        assert int(a["policy_version"]) == 0
    assert sum(policy.batch_sizes) == 40 and max(policy.batch_sizes) <= 8
    assert max(policy.batch_sizes) > 1  # requests queued while a batch ran were batched
    assert stats["requests"] == 40 and stats["batches"] == len(policy.batch_sizes)


async def test_min_batch_size_is_waited_for_up_to_the_timeout() -> None:
    policy = Scale()
    with anyio.fail_after(30):
        # Four requests reach min_batch_size: one batch, long before the 60 s timeout.
        async with InferenceServer(policy, min_batch_size=4, timeout=60) as server:
            await ask_all(server, [{"observation": torch.ones(1)}] * 4)
        assert policy.batch_sizes == [4]
        # Two never do: they go as one batch of 2 once the timeout has passed.
        async with InferenceServer(policy, min_batch_size=4, timeout=0.05) as server:
            start = anyio.current_time()
            await ask_all(server, [{"observation": torch.ones(1)}] * 2)
            waited = anyio.current_time() - start
        assert policy.batch_sizes == [4, 2]
        assert waited >= 0.04


async def test_weight_updates_land_between_forward_passes_and_answers_carry_the_version() -> None:
    policy = Gate()
    with anyio.fail_after(30):
        async with InferenceServer(policy) as server, anyio.create_task_group() as tg:
            first: list[Any] = []

            async def ask_first() -> None:
                first.append(await server({"observation": torch.ones(1)}))

            tg.start_soon(ask_first)
            await entered(policy.entered)  # the first forward pass runs, with weight 2
            update_done = anyio.Event()

            async def update() -> None:
                await server.update_policy_weights_({"weight": torch.tensor(5.0)})
                update_done.set()

            tg.start_soon(update)
            policy.release.set()
            await update_done.wait()
            assert server.policy_version == 1
            (second,) = await ask_all(server, [{"observation": torch.ones(1)}])
    assert float(first[0]["action"]) == 2.0 and int(first[0]["policy_version"]) == 0
    assert float(second["action"]) == 5.0 and int(second["policy_version"]) == 1


async def test_tensordict_policy_and_requests() -> None:
    module = TensorDictModule(torch.nn.Linear(3, 2), in_keys=["observation"], out_keys=["logits"])
    requests = [TensorDict(observation=torch.randn(3)) for _ in range(5)]
    with anyio.fail_after(30):
        async with InferenceServer(module, max_batch_size=4) as server:
            answers = await ask_all(server, requests)
    for req, a in zip(requests, answers, strict=True):
        assert isinstance(a, TensorDict) and a.batch_size == torch.Size([])
        with torch.no_grad():
            # The server ran a batch of requests, this one row: BLAS may sum in another order.
            torch.testing.assert_close(a["logits"], module.module(req["observation"]), rtol=1e-5, atol=1e-5)
        assert set(a.keys()) == {"observation", "logits", "policy_version"}


async def test_a_policy_failure_reaches_each_caller_of_its_batch_and_serving_goes_on() -> None:
    class FailsOnNegative(Scale):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            if (obs < 0).any():
                raise ArithmeticError("negative observation")
            return super().forward(obs)

    with anyio.fail_after(30):
        async with InferenceServer(FailsOnNegative()) as server:
            failed = r"^the policy raised ArithmeticError on a batch of 1 requests"
            with pytest.raises(InferenceError, match=failed) as info:
                await server({"observation": -torch.ones(1)})
            assert isinstance(info.value.__cause__, ArithmeticError)
            assert float((await server({"observation": torch.ones(1)}))["action"]) == 2.0


async def test_an_output_without_one_row_per_request_is_named() -> None:
    class Sums(torch.nn.Module):
        def forward(self, obs: torch.Tensor) -> torch.Tensor:
            return obs.sum()

    with anyio.fail_after(30):
        async with InferenceServer(Sums()) as server:
            with pytest.raises(PolicyOutputError, match=r"^policy output 'action' has shape \(\) for a batch of 1"):
                await server({"observation": torch.ones(2)})


@pytest.mark.parametrize(
    ("request_", "error", "message"),
    [
        (
            {"obs": torch.ones(1)},
            ValueError,
            r"^requests must hold the policy's in_keys \['observation'\], got \['obs'\]",
        ),
        ({"observation": 1.0}, TypeError, r"^a request's values must be tensors, got float for 'observation'"),
        (TensorDict(observation=torch.ones(2, 1), batch_size=[2]), ValueError, r"^a request must be unbatched"),
        ([1.0], TypeError, r"^a request must be a TensorDict or a mapping of tensors, got list"),
    ],
)
async def test_bad_requests_are_named(request_: Any, error: type[Exception], message: str) -> None:
    with anyio.fail_after(30):
        async with InferenceServer(Scale()) as server:
            with pytest.raises(error, match=message):
                await server(request_)
            assert float((await server({"observation": torch.ones(1)}))["action"]) == 2.0  # still serving


async def test_requests_of_different_shapes_in_one_batch_are_refused_together() -> None:
    with anyio.fail_after(30):
        async with InferenceServer(Scale(), min_batch_size=2, timeout=30) as server:
            with pytest.raises(ExceptionGroup) as info:
                await ask_all(server, [{"observation": torch.ones(1)}, {"observation": torch.ones(2)}])
    errors = info.value.exceptions
    assert len(errors) == 2 and all(isinstance(e, ValueError) for e in errors)
    assert all(str(e).startswith("requests batched together must have the same keys and shapes") for e in errors)


async def test_a_cancelled_request_never_reaches_the_policy() -> None:
    policy = Scale()
    with anyio.fail_after(30):
        async with InferenceServer(policy, min_batch_size=2, timeout=30) as server:
            with anyio.move_on_after(0.05):  # alone in the queue: its batch never fills up
                await server({"observation": torch.full((1,), -1.0)})
            answers = await ask_all(server, [{"observation": torch.full((1,), float(i))} for i in range(2)])
    assert policy.batch_sizes == [2]
    assert [float(a["action"]) for a in answers] == [0.0, 2.0]


async def test_closing_answers_every_waiting_caller_and_refuses_new_ones() -> None:
    policy = Gate()
    outcomes: list[BaseException] = []
    try:
        with anyio.fail_after(30):
            server = InferenceServer(policy, shutdown_timeout=0.2)
            with pytest.raises(RuntimeError, match=r"not running; use it inside 'async with server:'"):
                await server({"observation": torch.ones(1)})
            async with server, anyio.create_task_group() as tg:

                async def ask() -> None:
                    try:
                        await server({"observation": torch.ones(1)})
                    except InferenceServerClosedError as exc:
                        outcomes.append(exc)

                tg.start_soon(ask)
                await entered(policy.entered)  # in the forward pass, stuck until released
                tg.start_soon(ask)  # queued behind it
                await anyio.wait_all_tasks_blocked()
                await server.aclose()  # returns after shutdown_timeout, the forward still stuck
            assert len(outcomes) == 2
            with pytest.raises(InferenceServerClosedError, match=r"^this InferenceServer is closed"):
                await server({"observation": torch.ones(1)})
            assert "closed" in repr(server)
    finally:
        policy.release.set()  # let the server's thread leave the forward pass and end


async def test_the_event_loop_runs_while_the_policy_does() -> None:
    policy = Gate()
    try:
        with anyio.fail_after(30):
            async with InferenceServer(policy) as server, anyio.create_task_group() as tg:
                tg.start_soon(server, {"observation": torch.ones(1)})
                await entered(policy.entered)
                ticked = anyio.Event()

                async def tick() -> None:
                    ticked.set()

                tg.start_soon(tick)  # another task runs while the forward blocks its thread
                await ticked.wait()
                assert not policy.release.is_set()
                policy.release.set()
    finally:
        policy.release.set()


async def test_policy_factory_builds_the_policy_on_the_servers_thread() -> None:
    where: list[str] = []

    def factory() -> Scale:
        where.append(threading.current_thread().name)
        return Scale(4.0)

    with anyio.fail_after(30):
        async with InferenceServer(policy_factory=factory) as server:
            assert float((await server({"observation": torch.ones(1)}))["action"]) == 4.0
    assert where == ["aiocollect inference server"]


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, r"^InferenceServer needs exactly one of policy and policy_factory, got neither"),
        ({"policy": Scale(), "policy_factory": Scale}, ValueError, r"got both"),
        ({"policy": 3}, TypeError, r"^policy must be callable"),
        ({"policy": Scale(), "max_batch_size": 0}, ValueError, r"^max_batch_size must be a positive int, got 0$"),
        (
            {"policy": Scale(), "min_batch_size": 9, "max_batch_size": 8},
            ValueError,
            r"^min_batch_size must be at most max_batch_size \(8\), got 9; lower min_batch_size or raise max_",
        ),
        ({"policy": Scale(), "timeout": 0}, ValueError, r"^timeout must be a positive number of seconds, got 0$"),
        ({"policy": Scale(), "exploration_type": "greedy"}, ValueError, r"^exploration_type must be"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        InferenceServer(**kwargs)


async def test_no_version_key_and_an_output_device() -> None:
    with anyio.fail_after(30):
        async with InferenceServer(Scale(), policy_version_key=None, output_device="cpu") as server:
            answer = await server({"observation": torch.ones(1)})
    assert set(answer) == {"observation", "action"} and answer["action"].device == torch.device("cpu")


async def test_a_policy_already_on_the_device_is_served_as_it_is() -> None:
    # No copy is made when the parameters already live on ``device``: an in-place edit of the
    # user's module is served at once, and update_policy_weights_() still counts a version.
    policy = Scale(2.0)
    with anyio.fail_after(30):
        async with InferenceServer(policy, device="cpu") as server:
            with torch.no_grad():
                policy.weight.fill_(7.0)  # the server runs this very module: seen at once
            assert float((await server({"observation": torch.ones(1)}))["action"]) == 7.0
            await server.update_policy_weights_()
            answer = await server({"observation": torch.ones(1)})
    assert float(answer["action"]) == 7.0 and int(answer["policy_version"]) == 1


async def test_stats_count_requests_batches_and_latencies() -> None:
    policy = Scale()
    with anyio.fail_after(30):
        async with InferenceServer(policy, max_batch_size=4) as server:
            await ask_all(server, [{"observation": torch.ones(1)}] * 10)
            stats = server.stats()
    assert stats["requests"] == 10 and stats["batches"] == len(policy.batch_sizes)
    assert stats["queued"] == 0 and stats["max_batch_size_seen"] == max(policy.batch_sizes) <= 4
    assert stats["mean_batch_size"] == 10 / len(policy.batch_sizes)
    assert 0 <= stats["queue_wait_ms_p50"] <= stats["queue_wait_ms_p95"]
    assert 0 < stats["forward_ms_p50"] <= stats["forward_ms_p95"]
    assert stats["policy_version"] == 0


async def test_a_factory_that_raises_fails_the_entry_and_leaves_nothing_running() -> None:
    def factory() -> Scale:
        raise OSError("no model file")

    server = InferenceServer(policy_factory=factory)
    with anyio.fail_after(30), pytest.raises(OSError, match="no model file"):
        async with server:
            pass
    with pytest.raises(InferenceServerClosedError):
        await server({"observation": torch.ones(1)})
