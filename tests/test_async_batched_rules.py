"""AsyncBatchedCollector's failure rules: a coroutine policy that fails or runs late, and coroutine envs.

With ``on_policy_error="reset"`` / ``on_policy_timeout="truncate"`` a failed call ends its
env's trajectory instead of collection: no frame is made up for the action that never came,
the env's last frame is marked truncated, and the env starts a new trajectory. `CountEnv`
frames (``[env id, step in episode]``, reward = action) show exactly where each cut falls.
"""

from __future__ import annotations

import itertools
import threading
from functools import partial
from typing import Any

import anyio
import anyio.lowlevel
import pytest
import torch
from _central_envs import AsyncCountEnv, CountEnv, assert_refused_before_build

from aiocollect import AsyncBatchedCollector, InferenceError

pytestmark = pytest.mark.anyio

ENV_BACKENDS = ["threading", "multiprocessing", "coroutine"]
N_ENVS = 3


def count_envs(n: int, backend: str, **kwargs: Any) -> list[Any]:
    kind = AsyncCountEnv if backend == "coroutine" else CountEnv
    return [partial(kind, i, **kwargs) for i in range(n)]


class FailsOnCue:
    """Parity's action, except that env ``env``'s ``cue``-th call raises (or hangs, or answers wrongly).

    The other envs' calls after their second wait until that call has failed, so the cut
    falls in the first batch whatever the timing. A call that must run past
    ``policy_timeout`` cannot be waited for inside the others' calls (they would time out
    too): then the others' env steps wait instead (`gate`).
    """

    def __init__(self, env: int = 1, cue: int = 3, how: str = "raise", every: bool = False) -> None:
        self.env, self.cue, self.how, self.every = env, cue, how, every
        self.calls = [0] * 16
        self.failed = 0
        self._cut: anyio.Event | None = None
        self.cut = threading.Event()  # the same moment, for env threads

    def gate(self, env: int, steps: int) -> None:
        """`CountEnv`'s gate (on an env thread): the other envs' third steps wait for the cut."""
        if env != self.env and steps >= 2:
            assert self.cut.wait(30)

    async def agate(self, env: int, steps: int) -> None:
        """The same for coroutine envs."""
        if env != self.env and steps >= 2:
            with anyio.fail_after(30):
                while not self.cut.is_set():
                    await anyio.lowlevel.checkpoint()  # the cut is set on this loop: no thread to wake

    async def __call__(self, td: Any) -> Any:
        if self._cut is None:
            self._cut = anyio.Event()  # made on the loop that waits on it
        await anyio.lowlevel.checkpoint()
        env = int(td["collector", "env_id"])
        self.calls[env] += 1
        if self.every or (env == self.env and self.calls[env] == self.cue):
            self.failed += 1
            try:
                if self.how == "hang":
                    await anyio.sleep_forever()  # until policy_timeout cancels it
                if self.how == "wrong":
                    return torch.zeros(3)
                raise ConnectionError(f"the model server dropped env {env}'s request")
            finally:
                self._cut.set()
                self.cut.set()
        if not self.every and self.how != "hang" and env != self.env and self.calls[env] > 2:
            await self._cut.wait()
        return td["observation"][1].long() % 2


def frames_of(batches: list[Any], env: int) -> list[tuple[int, int, bool, bool]]:
    """Env ``env``'s frames across batches: (step in episode, traj id, truncated, terminated)."""
    out = []
    for b in batches:
        mine = b["collector", "env_id"] == env
        cols = (b["observation"][mine, 1], b["collector", "traj_ids"][mine], b["next", "truncated"][mine],
                b["next", "terminated"][mine])  # fmt: skip
        out += [(int(t), int(j), bool(tr), bool(te)) for t, j, tr, te in zip(*cols, strict=True)]
    return out


def check_cut(batches: list[Any], env: int = 1, at: int = 2) -> None:
    """Env ``env``'s first episode stops after ``at`` frames, truncated; the next starts at step 0."""
    frames = frames_of(batches, env)
    first = frames[: at + 1]
    assert [t for t, *_ in first] == [*range(at), 0], "no frame for the failed call; the env was reset"
    assert first[at - 1][2] and not first[at - 1][3], "the last frame before the cut is truncated, not terminated"
    assert first[at][1] != first[0][1], "a new trajectory after the cut"
    for i, ((t0, j0, tr0, te0), (t1, j1, _, _)) in enumerate(itertools.pairwise(frames)):
        if i == at - 1:
            continue
        if tr0 or te0:
            assert t1 == 0 and j1 != j0
        else:
            assert t1 == t0 + 1 and j1 == j0, "every other frame follows its predecessor"
    for b in batches:  # the other envs are untouched: each frame is one step of its own env
        assert torch.equal(b["observation"][:, 0].long(), b["collector", "env_id"])
        assert torch.equal(b["next", "observation"][:, 1], b["observation"][:, 1] + 1)


async def collect(policy: Any, env_backend: str, envs: Any = None, **kwargs: Any) -> tuple[list[Any], Any]:
    batches = []
    envs = count_envs(N_ENVS, env_backend) if envs is None else envs
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(envs, policy=policy, frames_per_batch=60,
                                         total_frames=120, env_backend=env_backend, **kwargs) as c:  # fmt: skip
            async for batch in c:
                batches.append(batch)
            stats = c.stats()
    return batches, stats


@pytest.mark.all_backends
@pytest.mark.parametrize("env_backend", ENV_BACKENDS)
async def test_on_policy_error_reset_cuts_the_trajectory_and_goes_on(env_backend: str) -> None:
    policy = FailsOnCue(env=1, cue=3)
    batches, stats = await collect(policy, env_backend, on_policy_error="reset")
    assert sum(b.numel() for b in batches) == 120
    check_cut(batches, env=1, at=2)
    assert (stats.policy_errors, stats.policy_timeouts) == (1, 0)


@pytest.mark.all_backends
@pytest.mark.parametrize("env_backend", ["threading", "coroutine"])
async def test_on_policy_timeout_truncate_cuts_the_trajectory_and_goes_on(env_backend: str) -> None:
    policy = FailsOnCue(env=1, cue=3, how="hang")
    gate = policy.agate if env_backend == "coroutine" else policy.gate
    batches, stats = await collect(policy, env_backend, count_envs(N_ENVS, env_backend, gate=gate),
                                   policy_timeout=0.05, on_policy_timeout="truncate", envs_per_worker=1)  # fmt: skip
    check_cut(batches, env=1, at=2)
    assert (stats.policy_errors, stats.policy_timeouts) == (0, 1)


async def test_a_cut_at_an_episodes_first_step_makes_no_frame() -> None:
    policy = FailsOnCue(env=1, cue=1)  # env 1's very first call: its trajectory has no frame yet
    batches, stats = await collect(policy, "threading", on_policy_error="reset")
    frames = frames_of(batches, 1)
    assert [t for t, *_ in frames[:4]] == [0, 1, 2, 3] and frames[3][3], "a whole episode after the cut"
    assert not any(tr for _, _, tr, _ in frames), "nothing to truncate: no frame was made before the cut"
    assert stats.policy_errors == 1


@pytest.mark.parametrize(
    ("how", "kwargs", "error", "match"),
    [
        ("raise", {"on_policy_timeout": "truncate"}, ConnectionError, "dropped env 1"),
        ("hang", {"policy_timeout": 0.05, "on_policy_error": "reset"}, InferenceError, "policy_timeout=0.05s"),
        ("wrong", {"on_policy_error": "reset"}, InferenceError, r"shape \(3,\) for 'action'"),
    ],
)
async def test_a_failure_the_rules_do_not_cover_still_stops_collection(
    how: str, kwargs: dict[str, Any], error: type, match: str
) -> None:
    policy = FailsOnCue(env=1, cue=3, how=how)
    with pytest.raises(error, match=match) as info:
        await collect(policy, "threading", count_envs(N_ENVS, "threading", gate=policy.gate), envs_per_worker=1,
                      **kwargs)  # fmt: skip
    assert "raised by the coroutine policy for env 1" in info.value.__notes__


@pytest.mark.parametrize("env_backend", ["threading", "coroutine"])
async def test_an_outage_stops_collection_instead_of_spinning(env_backend: str) -> None:
    policy = FailsOnCue(every=True)
    with pytest.raises(InferenceError, match="failed 8 calls in a row") as info:
        await collect(policy, env_backend, on_policy_error="reset")
    assert isinstance(info.value.__cause__, ConnectionError), "the last failure is chained"
    assert policy.failed >= 8


async def test_coroutine_env_rules_reach_the_envs() -> None:
    envs = [partial(AsyncCountEnv, i, fail_at=5 if i == 1 else None) for i in range(N_ENVS)]
    with anyio.fail_after(60):
        async with AsyncBatchedCollector(envs, frames_per_batch=30, total_frames=60, on_error="reset") as c:
            batches = [b async for b in c]
            stats = c.stats()
    assert len(batches) == 2
    assert stats.env_errors > 0, "env 1's failing steps were recorded as truncations"
    failed = [b for b in batches if bool(((b["collector", "env_id"] == 1) & (b["next", "reward"][:, 0] == 0)
                                          & b["next", "truncated"][:, 0]).any())]  # fmt: skip
    assert failed, "a failed step is a truncated frame with reward 0"


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"on_policy_timeout": "skip"}, ValueError, r"on_policy_timeout must be 'error' or 'truncate', got 'skip'"),
        ({"on_policy_error": "ignore"}, ValueError, r"on_policy_error must be 'raise' or 'reset', got 'ignore'"),
        ({"on_timeout": "skip"}, ValueError, r"on_timeout must be 'error' or 'truncate', got 'skip'"),
        ({"on_error": "ignore"}, ValueError, r"on_error must be 'raise' or 'reset', got 'ignore'"),
        ({"step_timeout": 0}, ValueError, "step_timeout"),
        ({"on_policy_error": "reset"}, ValueError, "on_policy_error applies to coroutine policies"),
        ({"on_policy_timeout": "truncate"}, ValueError, "on_policy_timeout applies to coroutine policies"),
        ({"on_error": "reset", "env_backend": "multiprocessing"}, ValueError,
         "on_error apply to coroutine envs, which env_backend='multiprocessing' cannot hold"),
    ],
)  # fmt: skip
def test_bad_rules_fail_before_anything_is_built(kwargs: dict[str, Any], error: type, match: str) -> None:
    assert_refused_before_build(error, match, **kwargs)


async def test_env_rules_on_gymnasium_envs_are_refused_with_the_reason() -> None:
    with anyio.fail_after(30), pytest.raises(TypeError, match="step_timeout apply to coroutine envs; env factory 0"):
        async with AsyncBatchedCollector(count_envs(2, "threading"), frames_per_batch=10, step_timeout=1.0) as c:
            async for _ in c:
                pass
