"""AsyncBatchedCollector: central inference, envs stepping on their own (TorchRL's name and arguments)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import InteractionType

from .._core._validate import check_choice, check_int, check_seconds
from .._envs._pool import ON_ERROR, ON_TIMEOUT
from .._rollout._coro import CoroutinePolicy, is_coroutine_policy
from .._serve._build import ENV_BACKENDS, CentralEnvs
from .._serve._slots import default_shard_count, shard_rows
from ._central_args import check_affinity_masks, resolve_torchrl_args
from ._collector import Collector
from ._flat_trajs import as_completed

__all__ = ["AsyncBatchedCollector"]

_ALIASES = (("env_index", ("collector", "env_id")),)
_log = logging.getLogger("aiocollect")


class AsyncBatchedCollector(Collector):
    """Run one policy, batched across every env, while each env steps on its own.

    Every other collector runs the policy next to its envs, in lock-step batches. Here the
    envs step independently, in shards (threads, or worker processes that hold envs only),
    and the policy runs where the collector is, on whichever envs are ready: at least
    ``min_batch_size`` of them (or what is ready ``server_timeout`` seconds after the first),
    at most ``max_batch_size`` per forward pass. A slow env never holds the others back, and
    the policy's weights live in one place (TorchRL's ``AsyncBatchedCollector``, done the
    asyncio way: the event loop only moves env ids, the policy runs on the collector's
    thread, the envs on theirs).

    Batches are flat ``[frames_per_batch]`` TensorDicts grouped by env: each env's frames are
    contiguous and in time order, so every trajectory is one run. Each frame has
    ``("collector", "env_id")`` (also TorchRL's ``"env_index"``), ``("collector",
    "traj_ids")`` and the policy version that chose its action (``("collector",
    "policy_version")``, also under ``policy_version_key``). With ``set_truncated=True`` each
    env's last frame in a batch is marked truncated, so value estimators (TorchRL's GAE) can
    run on the flat batch. A deterministic policy gives each env the trajectory that
    `Collector` gives it. See ``docs/central-inference.md``.

    Args:
        create_env_fn: One factory per env (or a gymnasium env id): each returns a single
            ``gymnasium.Env``, or a coroutine env (``async reset``/``step``, stepped on the event
            loop as in `AsyncEnvPool`). All envs must have the same spaces.
        policy: ``None`` (random actions), an ``nn.Module`` or a TensorDict policy, run on
            batches of ready envs; or a coroutine function (``async def policy(td)``, a client of
            a model server), awaited once per env and step with that env's unbatched
            observation, returning its action (a TensorDict holding the action keys, or the
            action tensor).
        policy_factory: A zero-argument callable that builds the policy on the collector's thread.
        frames_per_batch: Frames per batch.
        total_frames: Frame budget; ``-1`` for endless collection.
        max_batch_size: At most this many envs per forward pass (default 64).
        min_batch_size: Wait for this many ready envs before a forward pass (default 1), at most
            ``server_timeout`` seconds after the first.
        server_timeout: Seconds to wait for ``min_batch_size`` envs (default 0.01).
        device: Device the policy runs on.
        backend: TorchRL's default for ``env_backend``.
        env_backend: Where gymnasium envs step: ``"threading"`` (default: threads of this
            process) or ``"multiprocessing"`` (worker processes that hold envs only, no policy,
            exchanging observations and actions through shared memory). Coroutine envs always
            step on the event loop (``"coroutine"`` insists on it).
        envs_per_worker: Envs per shard (thread or process); default: the envs split evenly
            into one shard per CPU core.
        reset_at_each_iter: Reset every env at the start of every batch. The batch still holds
            what is ready first: per env, at most one frame of the step in flight when the
            previous batch filled (kept, never dropped), then its new trajectory from step 0;
            an env slower than the others may have few frames in the batch, or none.
        postproc: A callable applied to each batch.
        exploration_type: The interaction type the policy runs under.
        replay_buffer: A `ReplayBuffer` to write batches into; iteration then yields ``None``.
        post_collect_hook: Called with each batch as it is yielded or written.
        yield_completed_trajectories: Yield finished episodes instead of fixed-size batches:
            every episode finished so far, concatenated flat (each one contiguous), once they
            hold at least ``frames_per_batch`` frames; with a replay buffer, each finished
            episode is one write. Unfinished episodes carry over.
        weight_sync: TorchRL's weight sync scheme for the policy (see `update_policy_weights_`).
        create_env_kwargs: Keyword arguments for every factory, or one dict per factory.
        policy_version_key: A top-level key that repeats each frame's policy version
            (TorchRL's ``"policy_version"``); ``None`` leaves it out.
        set_truncated: Mark each env's last frame of a batch truncated.
        storing_device: Device of the yielded batches.
        max_queued_batches: Batches collected ahead of the consumer.
        shutdown_timeout: Seconds teardown waits for env steps in progress.
        start_method: ``env_backend="multiprocessing"``: ``"forkserver"`` (default on Linux) or ``"spawn"``.
        max_concurrency: At most this many coroutine-policy calls in flight at once, and at most
            this many coroutine-env steps; ``None``: no limit.
        policy_timeout: Seconds one coroutine-policy call may take (`InferenceError` naming
            the env after that); ``None``: no limit.
        on_policy_timeout: A coroutine-policy call past ``policy_timeout``: ``"error"`` (stop
            collection) or ``"truncate"`` (end that env's trajectory at its last frame, which
            is marked truncated if still in the batch being filled, reset the env, go on).
        on_policy_error: A coroutine-policy call that raised: ``"raise"`` (its exception,
            naming the env) or ``"reset"`` (as ``"truncate"``). Forgiven failures are counted
            in ``stats()`` (``policy_errors``, ``policy_timeouts``); as many in a row as there
            are envs (at least 8), with no answer between them, stop collection with an
            `InferenceError`. A wrong answer always stops it.
        step_timeout: Seconds one coroutine env's ``step`` may take (as in `AsyncEnvPool`).
        on_timeout: A coroutine env's step past ``step_timeout``: ``"error"`` or ``"truncate"``.
        on_error: A coroutine env's step that raised: ``"raise"`` or ``"reset"``. The three
            apply to coroutine envs only (gymnasium envs in threads or processes raise).
        gc_freeze: Keep Python's cyclic garbage collector off the objects that exist when
            collection starts, until the collector closes (``gc.freeze()``, counted and undone
            as for `AsyncEnvPool`): full collections otherwise scan every object of the
            process (~300k with torch) and stall the event loop for ~100 ms each, several
            times a second when each env step makes tasks (coroutine policies or envs).
            ``None`` (default): on for 256 envs or more.
        transport: TorchRL's inference transport: ``None``, ``"auto"`` or ``"driver"`` (the
            policy runs on the collector's thread); a transport object is refused.
        policy_backend: ``None`` or ``"threading"``; a policy served elsewhere is a coroutine
            policy here.
        env_exchange: ``"auto"`` or ``"shm"``: env workers always exchange through shared memory.
        transition_chunk_size: ``"auto"`` only (env workers hand each step's rows over at once).
        weight_sync_model_id: The name ``update_policy_weights_(model_id=...)`` and
            ``weights_dict`` use for the policy (default ``"policy"``).
        verbose: Log the start and each batch (logger ``"aiocollect"``, level INFO).
        worker_affinity: CPUs of each env worker process (``env_backend="multiprocessing"``):
            one list per worker, or a callable ``worker -> list``; set before it builds its envs.
        driver_affinity: CPUs of the collector's thread, which runs the policy and drives the
            envs; threads it starts (env threads) inherit them.
        server_config: TorchRL's ``InferenceServerConfig`` instead of ``max_batch_size``,
            ``min_batch_size`` and ``server_timeout`` (its ``service_backend`` must be
            ``"thread"``, without ``static_batch_size``).
        device_config: TorchRL's ``InferenceDeviceConfig`` instead of ``device`` (and
            ``storing_device``); its env and output devices must be the host's.
        policy_version: The version the first frames carry (default 0).

    Raises:
        TypeError, ValueError: A bad argument, before anything is built.

    Examples:
        >>> import anyio, gymnasium as gym
        >>> from aiocollect import AsyncBatchedCollector
        >>> async def main():
        ...     envs = [lambda: gym.make("CartPole-v1")] * 4
        ...     async with AsyncBatchedCollector(envs, frames_per_batch=64, total_frames=128) as c:
        ...         return [(b.shape, b["env_index"].unique().numel()) async for b in c]
        >>> anyio.run(main)
        [(torch.Size([64]), 4), (torch.Size([64]), 4)]
    """

    def __init__(
        self,
        create_env_fn: Sequence[Any],
        *,
        policy: Any = None,
        policy_factory: Callable[[], Any] | None = None,
        frames_per_batch: int,
        total_frames: int = -1,
        max_batch_size: int | None = None,
        min_batch_size: int | None = None,
        server_timeout: float | None = None,
        device: Any = None,
        backend: str | None = None,
        env_backend: str | None = None,
        envs_per_worker: int | None = None,
        reset_at_each_iter: bool = False,
        postproc: Any = None,
        exploration_type: InteractionType | str = InteractionType.RANDOM,
        replay_buffer: Any = None,
        post_collect_hook: Callable[[TensorDictBase], Any] | None = None,
        yield_completed_trajectories: bool = False,
        weight_sync: Any = None,
        create_env_kwargs: Mapping[str, Any] | Sequence[Mapping[str, Any]] | None = None,
        policy_version_key: Any = "policy_version",
        set_truncated: bool = False,
        storing_device: Any = None,
        max_queued_batches: int = 0,
        shutdown_timeout: float = 10.0,
        start_method: str | None = None,
        max_concurrency: int | None = None,
        policy_timeout: float | None = None,
        on_policy_timeout: str = "error",
        on_policy_error: str = "raise",
        step_timeout: float | None = None,
        on_timeout: str = "error",
        on_error: str = "raise",
        gc_freeze: bool | None = None,
        transport: Any = None,
        policy_backend: str | None = None,
        env_exchange: str = "auto",
        transition_chunk_size: int | str = "auto",
        weight_sync_model_id: str = "policy",
        verbose: bool = False,
        worker_affinity: Any = None,
        driver_affinity: Sequence[int] | None = None,
        server_config: Any = None,
        device_config: Any = None,
        policy_version: int = 0,
    ) -> None:
        fns = _check_fns(create_env_fn)
        n = len(fns)
        chosen = env_backend if env_backend is not None else backend
        chosen = "threading" if chosen is None else chosen
        if chosen not in ENV_BACKENDS:
            raise ValueError(f"env_backend must be one of {', '.join(map(repr, ENV_BACKENDS))}, got {chosen!r}")
        targs = resolve_torchrl_args(
            transport=transport, policy_backend=policy_backend, env_exchange=env_exchange,
            transition_chunk_size=transition_chunk_size, server_config=server_config, device_config=device_config,
            max_batch_size=max_batch_size, min_batch_size=min_batch_size, server_timeout=server_timeout,
            device=device, storing_device=storing_device, policy_version=policy_version,
            weight_sync_model_id=weight_sync_model_id, verbose=verbose, driver_affinity=driver_affinity,
            worker_affinity=worker_affinity, env_backend=chosen,
        )  # fmt: skip
        device, storing_device, server_timeout = targs.device, targs.storing_device, targs.server_timeout
        max_b = check_int("max_batch_size", 64 if targs.max_batch_size is None else targs.max_batch_size)
        min_b = check_int("min_batch_size", 1 if targs.min_batch_size is None else targs.min_batch_size)
        if min_b > max_b:
            raise ValueError(
                f"min_batch_size must be at most max_batch_size ({max_b}), got {min_b}; lower min_batch_size or "
                "raise max_batch_size"
            )
        if min_b > n:
            raise ValueError(
                f"min_batch_size must be at most the number of envs ({n}), got {min_b}; lower min_batch_size or "
                "add envs"
            )
        timeout = check_seconds("server_timeout", 0.01 if server_timeout is None else server_timeout)
        check_int("envs_per_worker", envs_per_worker, allow_none=True)
        masks = check_affinity_masks(targs.worker_affinity, len(shard_rows(n, envs_per_worker, default_shard_count())))
        check_int("max_concurrency", max_concurrency, allow_none=True)
        if start_method is not None:
            if chosen != "multiprocessing":
                raise ValueError("start_method applies to env_backend='multiprocessing' only; drop it")
            if start_method not in ("forkserver", "spawn"):
                raise ValueError(f"start_method must be 'forkserver' or 'spawn', got {start_method!r}")
        if policy_timeout is not None:
            check_seconds("policy_timeout", policy_timeout)
        env_rules = _check_rules(on_policy_timeout, on_policy_error, step_timeout, on_timeout, on_error, chosen)
        if gc_freeze is not None and not isinstance(gc_freeze, bool):
            raise TypeError(f"gc_freeze must be True, False or None, got {gc_freeze!r}")
        if not isinstance(yield_completed_trajectories, bool):
            raise TypeError(f"yield_completed_trajectories must be True or False, got {yield_completed_trajectories!r}")
        if yield_completed_trajectories and set_truncated:
            raise ValueError(
                "yield_completed_trajectories yields episodes that ended; set_truncated=True would end one at every "
                "batch: drop one of them"
            )
        self._coro: CoroutinePolicy | None = None
        if is_coroutine_policy(policy):
            self._coro = CoroutinePolicy(policy, max_concurrency, policy_timeout, on_timeout=on_policy_timeout,
                                         on_error=on_policy_error, max_in_a_row=max(8, n))  # fmt: skip
            policy = None  # awaited per env by the rollout, not run on the collector's thread
        else:
            for name, value, default in (("policy_timeout", policy_timeout, None),
                                         ("on_policy_timeout", on_policy_timeout, "error"),
                                         ("on_policy_error", on_policy_error, "raise")):  # fmt: skip
                if value != default:
                    raise ValueError(f"{name} applies to coroutine policies (async def) only; drop it")
        self._alias_keys = list(_ALIASES)
        if policy_version_key is not None:
            self._alias_keys.append((policy_version_key, ("collector", "policy_version")))
        self._central = CentralEnvs(
            fns, _check_kwargs(create_env_kwargs, n), chosen, envs_per_worker, min_ready=min_b, max_ready=max_b,
            max_wait=timeout, start_method=start_method, max_concurrency=max_concurrency, gc_freeze=gc_freeze,
            env_rules=env_rules, worker_affinity=masks,
        )  # fmt: skip
        self._driver_affinity, self._verbose, self._model_id = targs.driver_affinity, targs.verbose, targs.model_id
        self.max_batch_size, self.min_batch_size, self.server_timeout = max_b, min_b, timeout
        self.env_backend = chosen
        super().__init__(
            self._central, policy, frames_per_batch=frames_per_batch, total_frames=total_frames,
            reset_at_each_iter=reset_at_each_iter, postproc=postproc, exploration_type=exploration_type,
            policy_device=device, storing_device=storing_device, set_truncated=set_truncated,
            max_queued_batches=max_queued_batches, shutdown_timeout=shutdown_timeout,
            replay_buffer=replay_buffer, policy_factory=policy_factory, post_collect_hook=post_collect_hook,
            weight_sync_schemes=None if weight_sync is None else {"policy": weight_sync},
        )  # fmt: skip
        if yield_completed_trajectories:
            as_completed(self, self._cfg.frames_per_batch)
        if self._coro is not None:
            self._coro.version = targs.policy_version
        else:
            self._set_policy_version(targs.policy_version)

    def _build(self) -> None:
        if self._driver_affinity is not None:
            # The collector's thread: it runs the policy and drives the envs; threads it starts inherit it.
            os.sched_setaffinity(0, self._driver_affinity)
        super()._build()
        if self._verbose:
            _log.info("%r: %d env shards built, collecting %d frames per batch", self,
                      len(getattr(self._central, "fns", ())), self._cfg.frames_per_batch)  # fmt: skip
        assert self._rollout is not None
        self._rollout.aliases = tuple(self._alias_keys)  # type: ignore[union-attr]
        self._rollout.coro_policy = self._coro  # type: ignore[union-attr]

    async def update_policy_weights_(self, policy_or_weights: Any = None, **kwargs: Any) -> None:
        """Bring the policy up to date and bump `policy_version` (see `Collector.update_policy_weights_`).

        A coroutine policy holds its weights where it runs: update them there, then call this
        without arguments so that frames whose actions come after it carry the next version.
        """
        if kwargs.get("model_id") == self._model_id:  # TorchRL's weight_sync_model_id names the policy
            kwargs["model_id"] = "policy"
        weights_dict = kwargs.get("weights_dict")
        if isinstance(weights_dict, Mapping) and self._model_id in weights_dict:
            kwargs["weights_dict"] = {("policy" if k == self._model_id else k): v for k, v in weights_dict.items()}
        if self._coro is None:
            await super().update_policy_weights_(policy_or_weights, **kwargs)
            return
        if policy_or_weights is not None or any(v is not None for v in kwargs.values()):
            raise TypeError(
                "a coroutine policy holds its own weights, which this collector cannot load; update them where the "
                "policy runs, then call update_policy_weights_() without arguments to bump the version"
            )
        self._coro.version += 1

    async def _collect_one(self) -> TensorDictBase | None:
        out = await super()._collect_one()
        if self._verbose:
            _log.info("%r: %d frames collected", self, self._frames)
        return out

    def _policy_version(self) -> int:
        return super()._policy_version() if self._coro is None else self._coro.version

    def _env_counts(self) -> dict[str, Any]:
        counts = super()._env_counts()
        if self._coro is not None:
            counts.update(policy_errors=self._coro.errors, policy_timeouts=self._coro.timeouts)
        return counts

    def __repr__(self) -> str:
        return (
            f"<AsyncBatchedCollector {len(self._central.fns)} envs env_backend={self.env_backend!r} "
            f"max_batch_size={self.max_batch_size} min_batch_size={self.min_batch_size}>"
        )


def _check_fns(create_env_fn: Any) -> list[Any]:
    if isinstance(create_env_fn, (str, bytes)) or not isinstance(create_env_fn, Sequence) or not create_env_fn:
        raise TypeError(
            f"create_env_fn must be a non-empty list of env factories (one per env), got {create_env_fn!r}; "
            "pass [make_env] * num_envs"
        )
    for i, fn in enumerate(create_env_fn):
        if not (isinstance(fn, str) or callable(fn)):
            raise TypeError(f"create_env_fn[{i}] must be an env id or a callable that returns an env, got {fn!r}")
    return list(create_env_fn)


def _check_rules(on_policy_timeout: Any, on_policy_error: Any, step_timeout: Any, on_timeout: Any, on_error: Any,
                 env_backend: str) -> dict[str, Any]:  # fmt: skip
    """The failure rules, checked; returns the coroutine envs' (empty when all are defaults)."""
    for name, value, allowed in (("on_policy_timeout", on_policy_timeout, ON_TIMEOUT),
                                 ("on_policy_error", on_policy_error, ON_ERROR),
                                 ("on_timeout", on_timeout, ON_TIMEOUT), ("on_error", on_error, ON_ERROR)):  # fmt: skip
        check_choice(name, value, allowed)
    if step_timeout is not None:
        check_seconds("step_timeout", step_timeout)
    rules = {k: v for k, v, default in (("step_timeout", step_timeout, None), ("on_timeout", on_timeout, "error"),
                                        ("on_error", on_error, "raise")) if v != default}  # fmt: skip
    if rules and env_backend == "multiprocessing":
        raise ValueError(
            f"{', '.join(rules)} apply to coroutine envs, which env_backend='multiprocessing' cannot hold; drop "
            f"{'them' if len(rules) > 1 else 'it'} (an env in a worker process that fails stops collection)"
        )
    return rules


def _check_kwargs(kwargs: Any, n: int) -> list[dict[str, Any]]:
    if kwargs is None:
        return [{} for _ in range(n)]
    if isinstance(kwargs, Mapping):
        return [dict(kwargs) for _ in range(n)]
    if isinstance(kwargs, Sequence) and not isinstance(kwargs, str) and all(isinstance(k, Mapping) for k in kwargs):
        if len(kwargs) != n:
            raise ValueError(
                f"create_env_kwargs must be one dict or one per env ({n}), got a list of {len(kwargs)}; "
                "give one dict per factory"
            )
        return [dict(k) for k in kwargs]
    raise TypeError(f"create_env_kwargs must be a dict or a list of dicts, got {type(kwargs).__name__}")
