"""User-facing error messages, each matched exactly: rule, value and fix in one sentence.

* Every constructor rule fails before any env is built.
* An env output whose shape is not the one the env's spec promises raises, naming the env,
  the key, the method and both shapes, for every env kind and every path into the batch
  (never reshaped or broadcast silently), also from a worker process.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict, TensorDictBase

from aiocollect import (
    AsyncBatchedEnv,
    AsyncEnvPool,
    Collector,
    MultiSyncCollector,
    SyncDataCollector,
    wrap_gymnasium,
)
from aiocollect._core._errors import WorkerCrashedError, WorkerError
from aiocollect.testing import CountingEnv, SleepyAsyncEnv

AR = gym.vector.AutoresetMode


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
    assert str(WorkerCrashedError(1, 7, None)) == "worker 1 (pid 7) ended or lost its connection, without an exit code"


def test_set_seed_rejects_negative() -> None:
    c = Collector("CartPole-v1", frames_per_batch=4)
    with pytest.raises(ValueError, match=r"^seed must be a non-negative int, got -1$"):
        c.set_seed(-1)
    assert isinstance(c.set_seed(0), int)
    del c
    torch.manual_seed(0)


# -- env outputs whose shape is not the promised one ---------------------------------------------


def _exact(message: str) -> str:
    return "^" + re.escape(message) + "$"


class Misshapen(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole-v1 whose observations from the methods in ``on`` go through ``change``."""

    def __init__(self, change: Callable[[np.ndarray], Any], on: Sequence[str] = ("reset", "step")) -> None:
        super().__init__(gym.make("CartPole-v1"))
        self.change, self.on = change, on

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return (self.change(obs) if "reset" in self.on else obs), info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict[str, Any]]:
        obs, *rest = self.env.step(action)
        return (self.change(obs) if "step" in self.on else obs), *rest


def _cartpole_msg(shape: tuple[int, ...], method: str) -> str:
    return (
        f"env CartPole-v1 (gymnasium.Env) returned observation of shape {shape} from {method}(); "
        "its observation_space promises (4,); fix the env or its observation_space"
    )


@pytest.mark.parametrize("method", ["reset", "step"])
def test_gym_env_observation_of_the_same_size_is_not_reshaped(method: str) -> None:
    env = wrap_gymnasium(Misshapen(lambda o: o.reshape(2, 2), on=[method]))
    try:
        with pytest.raises(ValueError, match=_exact(_cartpole_msg((2, 2), method))):
            env.reset()
            env.step(TensorDict(action=torch.tensor(0)))
    finally:
        env.close()


@pytest.mark.parametrize("method", ["reset", "step"])
def test_gym_env_observation_of_another_size_names_both_shapes(method: str) -> None:
    def make() -> Misshapen:
        return Misshapen(lambda o: o[:3], on=[method])

    with pytest.raises(ValueError, match=_exact(_cartpole_msg((3,), method))):
        with SyncDataCollector(make, frames_per_batch=8, total_frames=8) as c:
            next(iter(c))


def test_env_output_error_is_a_public_value_error() -> None:
    import aiocollect

    assert issubclass(aiocollect.EnvOutputError, ValueError)
    assert issubclass(aiocollect.EnvOutputError, aiocollect.AiocollectError)
    env = wrap_gymnasium(Misshapen(lambda o: o[None]))
    try:
        with pytest.raises(aiocollect.EnvOutputError, match=_exact(_cartpole_msg((1, 4), "reset"))):
            env.reset()  # a stray leading dim of size 1 is a wrong shape too
    finally:
        env.close()


class DictObsEnv(gym.Env[Any, Any]):
    """A Dict observation space whose step() returns ``inner.a`` with a stray dim of size 1."""

    observation_space = spaces.Dict(
        {"pos": spaces.Box(-1.0, 1.0, (2,), np.float32), "inner": spaces.Dict({"a": spaces.Discrete(3)})}
    )
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        return {"pos": np.zeros(2, np.float32), "inner": {"a": 1}}, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return {"pos": np.zeros(2, np.float32), "inner": {"a": np.array([1])}}, 0.0, False, False, {}


@pytest.mark.parametrize("one_hot", [False, True], ids=["index", "one_hot"])
def test_nested_observation_error_names_the_key_and_the_sub_space(one_hot: bool) -> None:
    env = wrap_gymnasium(DictObsEnv(), one_hot=one_hot)
    env.reset()
    msg = (
        "env DictObsEnv (gymnasium.Env) returned observation ('inner', 'a') of shape (1,) from step(); "
        "its observation_space['inner']['a'] promises (); fix the env or its observation_space"
    )
    with pytest.raises(ValueError, match=_exact(msg)):
        env.step(TensorDict(action=torch.tensor(0)))


class ArrayVectorEnv(gym.vector.VectorEnv):
    """Three sub-envs with Box (4,) observations; row i's episodes last ``2 + i`` steps.

    ``wrong`` maps an output (``"reset"``, ``"partial_reset"`` (a reset with a
    ``reset_mask``), ``"step"``, ``"final_obs"``, ``"reward"``, ``"terminated"``,
    ``"truncated"``) to the shape returned in its place. Ended rows wait for the caller's
    masked reset, except in SAME_STEP mode, where they restart at once and their terminal
    observations go to ``info["final_obs"]``.
    """

    def __init__(self, mode: AR, wrong: dict[str, tuple[int, ...]]) -> None:
        self.num_envs = 3
        self.single_observation_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, 3)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, 3)
        self.metadata = {"autoreset_mode": mode}
        self.wrong = wrong
        self.t = np.zeros(3, np.int64)

    def _array(self, name: str, shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
        return np.zeros(self.wrong.get(name, shape), dtype)

    def reset(self, *, seed: Any = None, options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        mask = (options or {}).get("reset_mask")
        self.t[slice(None) if mask is None else mask] = 0
        return self._array("reset" if mask is None else "partial_reset", (3, 4)), {}

    def step(self, action: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        self.t += 1
        ended = self.t >= np.arange(2, 5)
        info: dict[str, Any] = {}
        if self.metadata["autoreset_mode"] == AR.SAME_STEP and ended.any():
            final = np.empty(3, dtype=object)
            for i in np.flatnonzero(ended):
                final[i] = self._array("final_obs", (4,))
            info = {"final_obs": final, "_final_obs": ended.copy()}
            self.t[ended] = 0
        term = self._array("terminated", (3,), np.bool_) if "terminated" in self.wrong else ended
        trunc = self._array("truncated", (3,), np.bool_)
        return self._array("step", (3, 4)), self._array("reward", (3,)), term, trunc, info


_VEC = "env ArrayVectorEnv (gymnasium.vector.VectorEnv) returned "
_VEC_OBS = (
    "; its single_observation_space promises (4,) per env, (3, 4) for 3 envs; "
    "fix the env or its single_observation_space"
)
VECTOR_CASES = {
    "step_same_size": ({"step": (3, 2, 2)}, f"{_VEC}observation of shape (3, 2, 2) from step(){_VEC_OBS}"),
    "step_other_size": ({"step": (3, 3)}, f"{_VEC}observation of shape (3, 3) from step(){_VEC_OBS}"),
    "reset": ({"reset": (3, 2, 2)}, f"{_VEC}observation of shape (3, 2, 2) from reset(){_VEC_OBS}"),
    "partial_reset": ({"partial_reset": (12,)}, f"{_VEC}observation of shape (12,) from reset(){_VEC_OBS}"),
    "reward": (
        {"reward": ()},
        f"{_VEC}reward of shape () from step(); a VectorEnv with num_envs=3 promises (3,); "
        "fix the env to return one reward value per sub-env",
    ),
    "terminated": (
        {"terminated": (1,)},
        f"{_VEC}terminated of shape (1,) from step(); a VectorEnv with num_envs=3 promises (3,); "
        "fix the env to return one terminated value per sub-env",
    ),
    "truncated": (
        {"truncated": (3, 1)},
        f"{_VEC}truncated of shape (3, 1) from step(); a VectorEnv with num_envs=3 promises (3,); "
        "fix the env to return one truncated value per sub-env",
    ),
}


def _run_vector(make: Callable[[], Any], path: str) -> None:
    """Drive the env through the public API, or collect one batch (see the paths below)."""
    if path == "public":  # reset, step until two rows ended, reset one not ended just now
        env = make()
        try:
            env.reset()
            for _ in range(3):
                env.step(TensorDict(action=torch.zeros(3, dtype=torch.int64), batch_size=[3]))
            env.reset(mask=torch.tensor([True, False, False]))
        finally:
            env.close()
        return
    # A step limit takes the collector's general path (the adapter writes into its own
    # buffers); without one, the adapter writes into the batch through numpy views.
    limit = 50 if path == "collector_step_limit" else None
    with SyncDataCollector(make, frames_per_batch=30, total_frames=30, max_frames_per_traj=limit) as c:
        next(iter(c))


_MODES = {"next_step": AR.NEXT_STEP, "same_step": AR.SAME_STEP, "disabled": AR.DISABLED}
# A partial reset is the collector's to make except under SAME_STEP, where rows restart inside
# step(): there only the public reset(mask) path can return a wrong-shaped reset observation.
_VECTOR_PARAMS = [
    pytest.param(case, _MODES[mode], path, id=f"{path}-{mode}-{case}")
    for case in VECTOR_CASES
    for mode in _MODES
    for path in ("public", "collector", "collector_step_limit")
    if not (case == "partial_reset" and mode == "same_step" and path != "public")
]


@pytest.mark.parametrize(("case", "mode", "path"), _VECTOR_PARAMS)
def test_vector_env_output_of_the_wrong_shape_raises(case: str, mode: AR, path: str) -> None:
    wrong, msg = VECTOR_CASES[case]
    with pytest.raises(ValueError, match=_exact(msg)):
        _run_vector(lambda: wrap_gymnasium(ArrayVectorEnv(mode, wrong)), path)


@pytest.mark.parametrize("path", ["public", "collector", "collector_step_limit"])
def test_vector_env_final_observation_of_the_wrong_shape_raises(path: str) -> None:
    msg = (
        f"{_VEC}observation of shape (2, 2) from step() as info['final_obs'][0]; "
        "its single_observation_space promises (4,); fix the env or its single_observation_space"
    )
    with pytest.raises(ValueError, match=_exact(msg)):
        _run_vector(lambda: wrap_gymnasium(ArrayVectorEnv(AR.SAME_STEP, {"final_obs": (2, 2)})), path)


class Reshaping(CountingEnv):
    """A `CountingEnv` of two envs whose ``key`` from ``method`` goes through ``change``.

    The TensorDict comes back unbatched, so that any shape reaches the collector.
    """

    def __init__(
        self, method: str, key: str, change: Callable[[torch.Tensor], torch.Tensor], num_envs: int = 2
    ) -> None:
        super().__init__(num_envs, episode_length=2)
        self.method, self.key, self.change = method, key, change

    def _out(self, method: str, td: TensorDictBase) -> TensorDictBase:
        if method != self.method:
            return td
        data = {k: td.get(k) for k in td.keys()}
        data[self.key] = self.change(data[self.key])
        return TensorDict(data, batch_size=[])

    def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        return self._out("reset", super().reset(mask, seeds))

    def step(self, action: TensorDictBase) -> TensorDictBase:
        return self._out("step", super().step(action))


class AsyncOf(AsyncBatchedEnv):
    """An `AsyncBatchedEnv` that forwards to a `BatchedEnv`."""

    def __init__(self, env: Any) -> None:
        self.env, self.spec = env, env.spec

    async def reset(self, mask: torch.Tensor | None = None, seeds: Sequence[int] | None = None) -> TensorDictBase:
        return self.env.reset(mask, seeds)

    async def step(self, action: TensorDictBase) -> TensorDictBase:
        return self.env.step(action)


_OBS_RULE = "; its spec promises (2, 3) (batch_size (2,) + observation shape (3,)); fix the env or its spec"
_FLAG_RULE = "; its spec's batch_size promises (2,) (or (2, 1)); fix the env or its spec"
BATCHED_CASES = {
    # (method, key, change, message tail): each was broadcast or reshaped into the batch, or
    # failed with a bare torch error
    "step_obs_broadcast": (
        "step", "observation", lambda v: v[:, :1], f"observation of shape (2, 1) from step(){_OBS_RULE}"
    ),
    "step_obs_unbatched": (
        "step", "observation", lambda v: v[0], f"observation of shape (3,) from step(){_OBS_RULE}"
    ),
    "step_obs_other_size": (
        "step", "observation", lambda v: torch.cat([v, v], -1), f"observation of shape (2, 6) from step(){_OBS_RULE}"
    ),
    "reset_obs_broadcast": (
        "reset", "observation", lambda v: v[:, :1], f"observation of shape (2, 1) from reset(){_OBS_RULE}"
    ),
    "reward_same_size": (
        "step", "reward", lambda v: v.reshape(1, 2), f"reward of shape (1, 2) from step(){_FLAG_RULE}"
    ),
    "terminated_other_size": (
        "step", "terminated", lambda v: v[:1], f"terminated of shape (1,) from step(){_FLAG_RULE}"
    ),
    "truncated_same_size": (
        "step", "truncated", lambda v: v.reshape(1, 2), f"truncated of shape (1, 2) from step(){_FLAG_RULE}"
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BATCHED_CASES))
def test_batched_env_output_of_the_wrong_shape_raises(case: str) -> None:
    method, key, change, rest = BATCHED_CASES[case]
    msg = f"env Reshaping (aiocollect.BatchedEnv) returned {rest}"
    with pytest.raises(ValueError, match=_exact(msg)):
        with SyncDataCollector(lambda: Reshaping(method, key, change), frames_per_batch=8, total_frames=8) as c:
            next(iter(c))


@pytest.mark.anyio
@pytest.mark.parametrize("case", ["step_obs_broadcast", "reset_obs_broadcast", "reward_same_size"])
async def test_async_batched_env_output_of_the_wrong_shape_raises(case: str) -> None:
    method, key, change, rest = BATCHED_CASES[case]
    msg = f"env AsyncOf (aiocollect.AsyncBatchedEnv) returned {rest}"
    with pytest.raises(ValueError, match=_exact(msg)):
        async with Collector(lambda: AsyncOf(Reshaping(method, key, change)), frames_per_batch=8) as c:
            await c.__anext__()


@pytest.mark.parametrize("num_envs", [2, 0], ids=["batched", "unbatched"])
@pytest.mark.parametrize("key", ["reward", "terminated", "truncated"])
def test_batched_env_flags_in_torchrl_layout_are_accepted(key: str, num_envs: int) -> None:
    # TorchRL's envs give reward/done flags a trailing dim of size 1: [*B, 1]
    def plain() -> CountingEnv:
        return CountingEnv(num_envs, episode_length=2)

    def make() -> Reshaping:
        return Reshaping("step", key, lambda v: v.unsqueeze(-1), num_envs=num_envs)

    batches = []
    for factory in (plain, make):
        with SyncDataCollector(factory, frames_per_batch=8, total_frames=8) as c:
            batches.append(next(iter(c)))
    for k in ("observation", ("next", "observation"), ("next", "reward"), ("next", "done"), ("next", "terminated")):
        assert torch.equal(batches[0][k], batches[1][k]), k


class Stretched(SleepyAsyncEnv):
    """A `SleepyAsyncEnv` whose step() observations gain a leading dim of size 1."""

    async def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, *rest = await super().step(action)
        return obs[None], *rest


@pytest.mark.anyio
async def test_async_env_pool_names_the_env_that_returned_the_wrong_shape() -> None:
    def pool() -> AsyncEnvPool:
        return AsyncEnvPool([SleepyAsyncEnv(delay=0), Stretched(delay=0)])

    msg = (
        "env Stretched (AsyncEnvPool env 1) returned observation of shape (1, 1) from step(); "
        "its observation_space promises (1,); fix the env or its observation_space"
    )
    with pytest.raises(ValueError, match=_exact(msg)):
        async with Collector(pool, frames_per_batch=8) as c:
            await c.__anext__()


def _cartpole() -> Any:
    return gym.make("CartPole-v1")


def _misshapen_cartpole() -> Any:
    return Misshapen(lambda o: o.reshape(2, 2), on=["step"])


@pytest.mark.anyio
@pytest.mark.timeout(120)
async def test_env_output_error_in_a_worker_process_names_the_worker() -> None:
    with anyio.fail_after(60):
        with pytest.raises(WorkerError) as info:
            async with MultiSyncCollector([_cartpole, _misshapen_cartpole], frames_per_batch=16) as c:
                await c.__anext__()
    err = info.value
    assert err.worker_id == 1
    prefix = rf"^worker 1 \(pid {err.pid}\) failed at step 0: EnvOutputError: "
    assert re.match(prefix + re.escape(_cartpole_msg((2, 2), "step")) + "$", str(err)), str(err)
    from aiocollect import EnvOutputError

    assert isinstance(err.__cause__, EnvOutputError)
