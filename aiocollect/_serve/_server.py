"""`InferenceServer`: one policy, many asyncio callers, dynamic batches, off the event loop.

Callers ``await server(request)``; the server's task takes what is queued, as one batch of
between ``min_batch_size`` (waiting at most ``timeout`` for it) and ``max_batch_size``
requests, and runs the policy on it in its own thread (`ThreadLane`), where the policy lives.
While one batch runs, the next one queues: under load, batches grow by themselves. Stacking,
the forward pass and splitting all run on that thread, so the event loop only moves
requests. A weight update runs on the same thread, between two forward passes, and every
answer carries the policy version its batch was computed with.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import torch

from .._core._errors import InferenceError, InferenceServerClosedError, PolicyOutputError
from .._core._threads import ThreadLane
from .._core._validate import check_int, check_seconds
from .._rollout._config import check_exploration_type
from .._rollout._policy import PolicyAdapter, require_materialized

__all__ = ["InferenceServer"]

_STATS_WINDOW = 1024


class _Request:
    """One caller's request and the wait for its answer.

    On asyncio the wait is a bare future of the running loop (its set and await run in C: a
    request costs a few microseconds of loop time, which is what limits a server's rate);
    elsewhere (trio) an ``anyio.Event``.
    """

    __slots__ = ("_event", "_future", "answered", "error", "inputs", "is_td", "queued", "result")

    def __init__(self, inputs: dict[Any, torch.Tensor], is_td: bool, loop: asyncio.AbstractEventLoop | None) -> None:
        self.inputs, self.is_td = inputs, is_td
        self.result: Any = None
        self.error: BaseException | None = None
        self.answered = False
        self._future = None if loop is None else loop.create_future()
        self._event = anyio.Event() if loop is None else None
        self.queued = time.perf_counter()

    def answer(self, result: Any = None, error: BaseException | None = None) -> None:
        if self.answered:
            return
        self.result, self.error, self.answered = result, error, True
        if self._future is not None:
            if not self._future.done():  # a cancelled caller's future is done already
                self._future.set_result(None)
        else:
            assert self._event is not None
            self._event.set()

    async def wait(self) -> None:
        if self._future is not None:
            await self._future
        else:
            assert self._event is not None
            await self._event.wait()


class InferenceServer:
    """Serve one policy to many asyncio tasks, running it on dynamic batches off the event loop.

    Each ``await server(request)`` queues one unbatched request (a ``TensorDict`` or a mapping
    of tensors) and returns its answer: the request's entries, the policy's outputs and the
    policy version they were computed with (under ``policy_version_key``), as the same kind
    of object. The server's task runs the policy on what is queued, between ``min_batch_size``
    and ``max_batch_size`` requests at a time, on a thread of its own, so the event loop keeps
    serving while the policy runs (TorchRL's ``InferenceServer``, done the asyncio way).

    Args:
        policy: An ``nn.Module`` taking the ``in_keys`` tensors and returning the ``out_keys``
            ones, or a TensorDict policy (a ``TensorDictModule``) that reads and writes its
            own keys. Give ``policy_factory`` instead to build it on the server's thread.
        policy_factory: A zero-argument callable that returns the policy.
        max_batch_size: The most requests one forward pass takes (TorchRL's default, 64).
        min_batch_size: After the first request of a batch arrives, wait up to ``timeout``
            seconds for this many; ``1`` (the default) runs whatever is queued at once.
        timeout: Seconds to wait for ``min_batch_size`` requests.
        device: Device the policy runs on; requests are moved there (the module is copied
            there if its parameters live elsewhere).
        output_device: Device answers are moved to (default: left where the policy put them).
        in_keys: A plain module's inputs, in order (default ``["observation"]``).
        out_keys: A plain module's outputs (default ``["action"]``).
        exploration_type: The interaction type TensorDict policies run under (``"random"``,
            TorchRL's collectors' default, or ``"deterministic"``, ``"mode"``, ...).
        policy_version_key: Key of the policy version in each answer; ``None`` leaves it out.
        shutdown_timeout: Seconds `aclose` waits for a forward pass in progress.

    Raises:
        TypeError, ValueError: A bad argument, before anything starts.

    Examples:
        >>> import anyio, torch
        >>> from aiocollect import InferenceServer
        >>> async def main():
        ...     policy = torch.nn.Linear(4, 2)
        ...     async with InferenceServer(policy, max_batch_size=8) as server:
        ...         answers = []
        ...         async def actor():
        ...             answers.append(await server({"observation": torch.zeros(4)}))
        ...         async with anyio.create_task_group() as tg:
        ...             for _ in range(3):
        ...                 tg.start_soon(actor)
        ...     return [(a["action"].shape, int(a["policy_version"])) for a in answers]
        >>> anyio.run(main)
        [(torch.Size([2]), 0), (torch.Size([2]), 0), (torch.Size([2]), 0)]
    """

    def __init__(
        self,
        policy: Any = None,
        *,
        policy_factory: Callable[[], Any] | None = None,
        max_batch_size: int = 64,
        min_batch_size: int = 1,
        timeout: float = 0.01,
        device: torch.device | str | None = None,
        output_device: torch.device | str | None = None,
        in_keys: list[Any] | None = None,
        out_keys: list[Any] | None = None,
        exploration_type: Any = "random",
        policy_version_key: Any = "policy_version",
        shutdown_timeout: float = 5.0,
    ) -> None:
        if (policy is None) == (policy_factory is None):
            raise ValueError(
                "InferenceServer needs exactly one of policy and policy_factory, got "
                + ("neither" if policy is None else "both")
                + "; pass the policy, or a factory that builds it"
            )
        if policy is not None and not callable(policy):
            raise TypeError(f"policy must be callable (an nn.Module or a TensorDict policy), got {policy!r}")
        if policy_factory is not None and not callable(policy_factory):
            raise TypeError(f"policy_factory must be a zero-argument callable, got {policy_factory!r}")
        self.max_batch_size = check_int("max_batch_size", max_batch_size)
        self.min_batch_size = check_int("min_batch_size", min_batch_size)
        if self.min_batch_size > self.max_batch_size:
            raise ValueError(
                f"min_batch_size must be at most max_batch_size ({max_batch_size}), got {min_batch_size}; "
                "lower min_batch_size or raise max_batch_size"
            )
        self.timeout = check_seconds("timeout", timeout)
        self.shutdown_timeout = check_seconds("shutdown_timeout", shutdown_timeout)
        self.device = None if device is None else torch.device(device)
        self.output_device = None if output_device is None else torch.device(output_device)
        self._exploration = check_exploration_type(exploration_type)
        self._in_keys = list(in_keys) if in_keys is not None else ["observation"]
        self._out_keys = list(out_keys) if out_keys is not None else ["action"]
        if not self._in_keys or not self._out_keys:
            raise ValueError(f"in_keys and out_keys must name at least one key, got {in_keys!r} and {out_keys!r}")
        self.policy_version_key = policy_version_key
        self._policy, self._factory = policy, policy_factory
        self._adapter: PolicyAdapter | None = None
        self._lane = ThreadLane("aiocollect inference server")
        self._queue: deque[_Request] = deque()
        self._arrived = anyio.Event()
        self._tg: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._serve_scope = anyio.CancelScope()
        self._state = "new"  # new -> running -> closed
        self._in_flight: list[_Request] = []
        self._requests = self._batches = 0
        self._batch_sizes: deque[int] = deque(maxlen=_STATS_WINDOW)
        self._forward_s: deque[float] = deque(maxlen=_STATS_WINDOW)
        self._wait_s: deque[float] = deque(maxlen=_STATS_WINDOW)

    # -- life ------------------------------------------------------------------------------
    async def __aenter__(self) -> InferenceServer:
        if self._state != "new":
            raise RuntimeError(f"this InferenceServer is {self._state}; an InferenceServer can be entered once")
        try:
            self._adapter = await self._lane.run(self._build)
        except BaseException:
            self._state = "closed"
            self._lane.close()
            raise
        self._loop = _running_asyncio_loop()
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._state = "running"
        self._tg.start_soon(self._serve)
        return self

    async def __aexit__(self, *exc: Any) -> bool | None:
        await self.aclose()
        return await self._tg.__aexit__(*exc)

    def _build(self) -> PolicyAdapter:
        policy = self._policy if self._factory is None else self._factory()
        adapter = PolicyAdapter(policy, policy_device=self.device, exploration_type=self._exploration)
        if self._factory is None and adapter.policy is not adapter.original:
            require_materialized(policy, f"its copy on device={self.device}")
        adapter.bind_keys(self._in_keys, self._out_keys)
        return adapter

    async def aclose(self) -> None:
        """Stop serving: queued and unanswered requests raise `InferenceServerClosedError`. Idempotent.

        A forward pass in progress gets ``shutdown_timeout`` seconds to end; the server's thread
        is then left to finish it on its own (it is a daemon thread). Leaving ``async with``
        calls it.
        """
        if self._state == "closed":
            return
        self._state = "closed"
        self._serve_scope.cancel()
        self._fail_all(InferenceServerClosedError("the InferenceServer closed before answering this request"))
        with anyio.CancelScope(shield=True), anyio.move_on_after(self.shutdown_timeout):
            await self._lane.aclose()
        self._lane.close()

    def _fail_all(self, error: BaseException) -> None:
        for req in (*self._queue, *self._in_flight):
            req.answer(error=error)
        self._queue.clear()
        self._in_flight = []

    # -- requests --------------------------------------------------------------------------
    async def __call__(self, request: Any) -> Any:
        """Queue one unbatched request and return its answer (see the class docstring).

        Raises:
            InferenceServerClosedError: The server is closed, or closed before answering.
            InferenceError: The policy raised on this request's batch (its error is the cause).
            PolicyOutputError: The policy did not return one row per request for an out key.
        """
        if self._state != "running":
            if self._state == "closed":
                raise InferenceServerClosedError("this InferenceServer is closed; create a new one")
            raise RuntimeError("this InferenceServer is not running; use it inside 'async with server:'")
        req = _Request(*_leaves(request), self._loop)
        self._queue.append(req)
        self._requests += 1
        self._arrived.set()
        try:
            await req.wait()
        except BaseException:
            if not req.answered:
                try:
                    self._queue.remove(req)  # not taken yet: it never reaches the policy
                except ValueError:
                    pass  # in a batch already: its answer goes nowhere
            raise
        if req.error is not None:
            raise req.error
        return req.result

    @property
    def policy_version(self) -> int:
        """The version answers are computed with now: 0, plus one per weight update."""
        return 0 if self._adapter is None else self._adapter.version

    async def update_policy_weights_(self, policy_or_weights: Any = None) -> None:
        """Load new weights between two forward passes; later batches carry the next version.

        Args:
            policy_or_weights: A module, a state dict or a TensorDict of weights; ``None``
                reloads the original policy's (the server runs a copy on another device).
        """
        if self._state != "running" or self._adapter is None:
            raise RuntimeError("update_policy_weights_() needs a running InferenceServer ('async with server:')")
        await self._lane.run_final(self._adapter.update_weights, policy_or_weights)

    def stats(self) -> dict[str, Any]:
        """Requests and batches served, batch sizes, and forward and queue-wait latencies (ms).

        Latencies are over the last 1024 batches: p50 and p95 of the forward pass, and of the
        time a request waited in the queue before its batch started.
        """
        sizes = list(self._batch_sizes)
        return {
            "requests": self._requests,
            "batches": self._batches,
            "queued": len(self._queue),
            "mean_batch_size": sum(sizes) / len(sizes) if sizes else 0.0,
            "max_batch_size_seen": max(sizes, default=0),
            "forward_ms_p50": _quantile(self._forward_s, 0.5) * 1e3,
            "forward_ms_p95": _quantile(self._forward_s, 0.95) * 1e3,
            "queue_wait_ms_p50": _quantile(self._wait_s, 0.5) * 1e3,
            "queue_wait_ms_p95": _quantile(self._wait_s, 0.95) * 1e3,
            "policy_version": self.policy_version,
        }

    def __repr__(self) -> str:
        return (
            f"<InferenceServer {self._state} max_batch_size={self.max_batch_size} "
            f"min_batch_size={self.min_batch_size} requests={self._requests} batches={self._batches}>"
        )

    # -- the serving task ----------------------------------------------------------------------
    async def _serve(self) -> None:
        with self._serve_scope:
            await self._serve_batches()

    async def _serve_batches(self) -> None:
        try:
            while True:
                await self._gather()
                batch = [self._queue.popleft() for _ in range(min(len(self._queue), self.max_batch_size))]
                self._in_flight = batch
                started = time.perf_counter()
                for req in batch:
                    self._wait_s.append(started - req.queued)
                try:
                    answers = await self._lane.run(self._forward, batch)
                except Exception as exc:  # the policy's, its output's or the requests' fault: these only
                    for req in batch:
                        req.answer(error=_error_for_one(exc, len(batch)))
                else:
                    for req, answer in zip(batch, answers, strict=True):
                        req.answer(answer)
                self._in_flight = []
                self._forward_s.append(time.perf_counter() - started)
                self._batches += 1
                self._batch_sizes.append(len(batch))
        finally:
            self._fail_all(InferenceServerClosedError("the InferenceServer stopped before answering this request"))

    async def _gather(self) -> None:
        """Wait for a first request, then up to ``timeout`` seconds for ``min_batch_size`` of them."""
        while not self._queue:
            self._arrived = anyio.Event()
            await self._arrived.wait()
        if len(self._queue) >= self.min_batch_size:
            return
        with anyio.move_on_after(self.timeout - (time.perf_counter() - self._queue[0].queued)):
            while len(self._queue) < self.min_batch_size:
                self._arrived = anyio.Event()
                await self._arrived.wait()

    def _forward(self, batch: list[_Request]) -> list[Any]:
        """On the server's thread: stack, run the policy once, split (one answer per request)."""
        adapter = self._adapter
        assert adapter is not None
        n = len(batch)
        first = batch[0].inputs
        if not adapter.takes_tensordict:
            missing = [k for k in self._in_keys if k not in first]
            if missing:
                raise _BadRequest(
                    f"requests must hold the policy's in_keys {self._in_keys}, got {sorted(map(str, first))}; "
                    "send them, or name the policy's inputs with in_keys="
                )
        try:
            stacked = {k: torch.stack([req.inputs[k] for req in batch]) for k in first}
        except (KeyError, RuntimeError) as exc:
            raise _BadRequest(
                f"requests batched together must have the same keys and shapes as the first one "
                f"({sorted(map(str, first))}): {exc}"
            ) from exc
        versions: list[int] = []
        out = adapter(stacked, versions)
        rows: dict[Any, tuple[torch.Tensor, ...]] = {}
        for k, v in out.items():
            if v.ndim == 0 or v.shape[0] != n:
                raise PolicyOutputError(
                    f"policy output {k!r} has shape {tuple(v.shape)} for a batch of {n} requests; "
                    "a served policy must return one row per request"
                )
            if self.output_device is not None:
                v = v.to(self.output_device)
            rows[k] = v.unbind(0)
        key = self.policy_version_key
        # One 0-d tensor per answer (a caller may write to its own), from one allocation.
        version = torch.full((n,), versions[0], dtype=torch.int64).unbind(0)
        answers = []
        for i, req in enumerate(batch):
            entries = dict(req.inputs)
            entries.update((k, r[i]) for k, r in rows.items())
            if key is not None:
                entries[key] = version[i]
            answers.append(_as_td(entries) if req.is_td else entries)
        return answers


def _running_asyncio_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:  # trio
        return None


def _leaves(request: Any) -> tuple[dict[Any, torch.Tensor], bool]:
    from tensordict import TensorDictBase

    if isinstance(request, TensorDictBase):
        if request.batch_dims:
            raise ValueError(
                f"a request must be unbatched (batch_size []), got batch_size {list(request.batch_size)}; "
                "send one request per env, the server batches them"
            )
        return dict(request.items(include_nested=True, leaves_only=True)), True
    if isinstance(request, Mapping):
        bad = [k for k, v in request.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise TypeError(f"a request's values must be tensors, got {type(request[bad[0]]).__name__} for {bad[0]!r}")
        return dict(request), False
    raise TypeError(f"a request must be a TensorDict or a mapping of tensors, got {type(request).__name__}")


def _as_td(entries: dict[Any, torch.Tensor]) -> Any:
    from tensordict import TensorDict

    return TensorDict(entries, batch_size=[])


class _BadRequest(ValueError):
    """Requests that cannot be batched or fed to the policy (raised to their callers as ValueError)."""


def _error_for_one(exc: BaseException, n: int) -> BaseException:
    """A fresh exception for one caller of a failed batch (each raise writes its own traceback)."""
    if isinstance(exc, _BadRequest):
        error: BaseException = ValueError(*exc.args)
    elif isinstance(exc, PolicyOutputError):
        error = PolicyOutputError(*exc.args)
    else:
        error = InferenceError(f"the policy raised {type(exc).__name__} on a batch of {n} requests: {exc}")
    error.__cause__ = exc.__cause__ if isinstance(exc, _BadRequest) else exc
    return error


def _quantile(values: deque[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
