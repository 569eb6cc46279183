"""The gymnasium adapters: space mapping, value conversion, valid actions, public reset/step.

`SpaceEnv` emits random members of whatever observation space it is given and records every
transition (observation before, action received, observation after); it asserts that each
action it receives is a member of its action space. The tests compare what the collector
recorded against what the env really emitted and received, leaf by leaf, for a single env and
for a ``SyncVectorEnv`` in the NEXT_STEP and SAME_STEP autoreset modes (SAME_STEP takes the
terminal observation from ``info["final_obs"]``, a separate conversion path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from tensordict import TensorDict

from aiocollect import BatchedEnv, Collector, SyncDataCollector, wrap_gymnasium

AR = gym.vector.AutoresetMode
F = torch.nn.functional


class SpaceEnv(gym.Env[Any, Any]):
    """Emits random observations from ``obs_space``; episodes last ``length`` steps.

    ``transitions`` holds ``(obs, action, next_obs)`` for every step; ``emit`` (optional)
    post-processes each emitted observation (e.g. to return a non-contiguous array).
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - gymnasium's convention

    def __init__(
        self,
        obs_space: spaces.Space[Any],
        act_space: spaces.Space[Any] | None = None,
        *,
        length: int = 3,
        seed: int = 0,
        emit: Callable[[Any], Any] | None = None,
    ) -> None:
        self.observation_space = obs_space
        self.action_space = act_space if act_space is not None else spaces.Discrete(2)
        self.observation_space.seed(seed)
        self.length = length
        self.emit = emit or (lambda o: o)
        self.t = 0
        self.current: Any = None
        self.transitions: list[tuple[Any, Any, Any]] = []
        self.reset_seeds: list[int | None] = []
        self.closed = False

    def _sample(self) -> Any:
        return self.emit(self.observation_space.sample())

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.reset_seeds.append(seed)
        self.t = 0
        self.current = self._sample()
        return self.current, {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        assert self.action_space.contains(action), f"{action!r} is not in {self.action_space}"
        self.t += 1
        nxt = self._sample()
        self.transitions.append((self.current, action, nxt))
        self.current = nxt
        return nxt, float(self.t), self.t >= self.length, False, {}

    def close(self) -> None:
        self.closed = True


# -- expected mapping, written independently of the adapter ---------------------------------------


@dataclass
class Leaf:
    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: str
    get: Callable[[Any], torch.Tensor]  # gymnasium value -> expected tensor


def _box(path: tuple[Any, ...] = ()) -> Callable[[Any], torch.Tensor]:
    def get(v: Any) -> torch.Tensor:
        for p in path:
            v = v[p]
        return torch.as_tensor(np.array(v))

    return get


def _index(path: tuple[Any, ...], start: Any) -> Callable[[Any], torch.Tensor]:
    def get(v: Any) -> torch.Tensor:
        for p in path:
            v = v[p]
        return torch.as_tensor(np.asarray(v, dtype=np.int64) - np.asarray(start, dtype=np.int64))

    return get


def _one_hot(path: tuple[Any, ...], start: int, n: int) -> Callable[[Any], torch.Tensor]:
    idx = _index(path, start)
    return lambda v: F.one_hot(idx(v), n)


@dataclass
class ObsCase:
    make: Callable[[], spaces.Space[Any]]  # a fresh space per env (vector sub-envs must not share one)
    one_hot: bool
    leaves: dict[Any, Leaf]


OBS_CASES = {
    "box_float32": ObsCase(
        lambda: spaces.Box(-2.0, 3.0, (3,), np.float32),
        False,
        {"observation": Leaf((3,), torch.float32, "box", _box())},
    ),
    "box_uint8_image": ObsCase(
        lambda: spaces.Box(0, 255, (8, 6, 3), np.uint8),
        False,
        {"observation": Leaf((8, 6, 3), torch.uint8, "box", _box())},
    ),
    "box_int64_scalar": ObsCase(
        lambda: spaces.Box(-5, 5, (), np.int64),
        False,
        {"observation": Leaf((), torch.int64, "box", _box())},
    ),
    "discrete_start": ObsCase(
        lambda: spaces.Discrete(5, start=3),
        False,
        {"observation": Leaf((), torch.int64, "discrete", _index((), 3))},
    ),
    "discrete_start_one_hot": ObsCase(
        lambda: spaces.Discrete(5, start=-2),
        True,
        {"observation": Leaf((5,), torch.int64, "one_hot", _one_hot((), -2, 5))},
    ),
    "multi_discrete_start": ObsCase(
        lambda: spaces.MultiDiscrete([3, 4], start=[1, -2]),
        False,
        {"observation": Leaf((2,), torch.int64, "multi_discrete", _index((), [1, -2]))},
    ),
    "multi_binary": ObsCase(
        lambda: spaces.MultiBinary([2, 3]),
        False,
        {"observation": Leaf((2, 3), torch.int8, "binary", _box())},
    ),
    "nested_dict": ObsCase(
        lambda: spaces.Dict(
            {
                "pos": spaces.Box(-1.0, 1.0, (2,), np.float32),
                "inner": spaces.Dict(
                    {
                        "a": spaces.Discrete(4, start=1),
                        "b": spaces.Tuple((spaces.Box(0.0, 1.0, (2,), np.float64), spaces.MultiBinary(3))),
                    }
                ),
            }
        ),
        True,  # one_hot also applies to Discrete leaves nested in a Dict
        {
            "pos": Leaf((2,), torch.float32, "box", _box(("pos",))),
            ("inner", "a"): Leaf((4,), torch.int64, "one_hot", _one_hot(("inner", "a"), 1, 4)),
            ("inner", "b", "0"): Leaf((2,), torch.float64, "box", _box(("inner", "b", 0))),
            ("inner", "b", "1"): Leaf((3,), torch.int8, "binary", _box(("inner", "b", 1))),
        },
    ),
    "tuple": ObsCase(
        lambda: spaces.Tuple(
            (
                spaces.Discrete(3, start=1),
                spaces.Box(-1.0, 1.0, (2,), np.float32),
                spaces.Dict({"c": spaces.MultiDiscrete([2, 2])}),
            )
        ),
        False,
        {
            ("observation", "0"): Leaf((), torch.int64, "discrete", _index((0,), 1)),
            ("observation", "1"): Leaf((2,), torch.float32, "box", _box((1,))),
            ("observation", "2", "c"): Leaf((2,), torch.int64, "multi_discrete", _index((2, "c"), 0)),
        },
    ),
}


def _nxt(key: Any) -> tuple[str, ...]:
    return ("next", key) if isinstance(key, str) else ("next", *key)


def _single(case: ObsCase, **kw: Any) -> tuple[list[SpaceEnv], Callable[[], BatchedEnv]]:
    envs: list[SpaceEnv] = []

    def make() -> BatchedEnv:
        envs[:] = [SpaceEnv(case.make(), **kw)]
        return wrap_gymnasium(envs[0], one_hot=case.one_hot)

    return envs, make


def _vector(case: ObsCase, mode: AR, n: int = 2, **kw: Any) -> tuple[list[SpaceEnv], Callable[[], BatchedEnv]]:
    envs: list[SpaceEnv] = []

    def make() -> BatchedEnv:
        envs[:] = [SpaceEnv(case.make(), seed=i, length=2 + i, **kw) for i in range(n)]
        vec = gym.vector.SyncVectorEnv([(lambda e=e: e) for e in envs], autoreset_mode=mode)
        return wrap_gymnasium(vec, one_hot=case.one_hot)

    return envs, make


def _check_recorded_obs(case: ObsCase, batch: TensorDict, envs: list[SpaceEnv]) -> None:
    T = batch.shape[-1]
    for r, env in enumerate(envs):
        assert len(env.transitions) == T
        for key, leaf in case.leaves.items():
            got = batch.get(key).reshape(len(envs), T, *leaf.shape)[r]
            got_next = batch.get(_nxt(key)).reshape(len(envs), T, *leaf.shape)[r]
            assert got.dtype == got_next.dtype == leaf.dtype, key
            for i, (obs, _, nxt) in enumerate(env.transitions):
                assert torch.equal(got[i], leaf.get(obs).to(leaf.dtype)), f"{key} row {r} frame {i}"
                assert torch.equal(got_next[i], leaf.get(nxt).to(leaf.dtype)), f"next {key} row {r} frame {i}"


@pytest.mark.parametrize("name", list(OBS_CASES))
def test_observation_spec(name: str) -> None:
    case = OBS_CASES[name]
    env = wrap_gymnasium(SpaceEnv(case.make()), one_hot=case.one_hot)
    assert env.spec.batch_size == torch.Size([])
    assert set(env.spec.observation) == set(case.leaves)
    for key, leaf in case.leaves.items():
        spec = env.spec.observation[key]
        assert (spec.shape, spec.dtype, spec.kind) == (leaf.shape, leaf.dtype, leaf.kind), key
    assert list(env.spec.action) == ["action"]
    env.close()


@pytest.mark.parametrize("name", list(OBS_CASES))
def test_observation_spec_vector(name: str) -> None:
    case = OBS_CASES[name]
    envs, make = _vector(case, AR.NEXT_STEP, n=3)
    env = make()
    assert env.spec.batch_size == torch.Size([3])
    # specs stay per env (unbatched)
    assert {k: s.shape for k, s in env.spec.observation.items()} == {k: v.shape for k, v in case.leaves.items()}
    env.close()
    assert all(e.closed for e in envs)


def test_spec_bounds_and_categories() -> None:
    env = wrap_gymnasium(
        SpaceEnv(
            spaces.Dict(
                {
                    "box": spaces.Box(np.array([-1.0, 0.0], np.float32), np.array([2.0, 5.0], np.float32)),
                    "d": spaces.Discrete(7, start=4),
                    "md": spaces.MultiDiscrete([3, 5], start=[2, 2]),
                }
            )
        )
    )
    box = env.spec.observation["box"]
    assert torch.equal(
        torch.as_tensor(box.low, dtype=torch.float64),
        torch.tensor([-1.0, 0.0], dtype=torch.float64),
    )
    assert torch.equal(
        torch.as_tensor(box.high, dtype=torch.float64),
        torch.tensor([2.0, 5.0], dtype=torch.float64),
    )
    assert env.spec.observation["d"].n == 7  # categories, independent of start
    assert env.spec.observation["md"].nvec.tolist() == [3, 5]
    env.close()


@pytest.mark.parametrize("name", list(OBS_CASES))
def test_observation_values_single(name: str) -> None:
    case = OBS_CASES[name]
    envs, make = _single(case)
    with SyncDataCollector(make, frames_per_batch=7, total_frames=7) as c:
        (batch,) = list(c)
    assert batch.shape == (7,)
    _check_recorded_obs(case, batch, envs)
    assert envs[0].closed


@pytest.mark.parametrize("mode", [AR.NEXT_STEP, AR.SAME_STEP], ids=["next_step", "same_step"])
@pytest.mark.parametrize("name", list(OBS_CASES))
def test_observation_values_vector(name: str, mode: AR) -> None:
    case = OBS_CASES[name]
    envs, make = _vector(case, mode)
    with SyncDataCollector(make, frames_per_batch=14, total_frames=14) as c:
        (batch,) = list(c)
    assert batch.shape == (2, 7)
    # every episode ended at least twice, so terminal observations were checked too
    assert batch[("next", "done")].sum(-2).squeeze(-1).tolist() == [3, 2]
    _check_recorded_obs(case, batch, envs)


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["nested_dict", "tuple"])
async def test_observation_values_async_collector(name: str) -> None:
    case = OBS_CASES[name]
    envs, make = _vector(case, AR.SAME_STEP)
    async with Collector(make, frames_per_batch=10, total_frames=10) as c:
        batches = [b async for b in c]
    assert len(batches) == 1
    _check_recorded_obs(case, batches[0], envs)


# -- observations that are valid but not in the space's exact array form ------------------------


@pytest.mark.parametrize(
    ("space", "emit", "dtype"),
    [
        # np.flipud/rot90 return negative-stride views, a common way to orient rendered images
        pytest.param(
            spaces.Box(0, 255, (4, 5, 3), np.uint8),
            lambda o: np.flipud(o),
            torch.uint8,
            id="flipped_image",
        ),
        pytest.param(
            spaces.Box(-1.0, 1.0, (3, 2), np.float32),
            lambda o: o.T.T[::-1, ::-1],
            torch.float32,
            id="reversed_box",
        ),
        pytest.param(
            spaces.Box(-1.0, 1.0, (3,), np.float32),
            lambda o: o.astype(np.float64),
            torch.float32,
            id="float64_for_float32_box",
        ),
        pytest.param(spaces.Box(-1.0, 1.0, (3,), np.float32), lambda o: o.tolist(), torch.float32, id="list"),
        pytest.param(spaces.MultiBinary(4), lambda o: o.astype(bool), torch.int8, id="bool_multibinary"),
    ],
)
def test_observation_forms_are_converted(
    space: spaces.Space[Any], emit: Callable[[Any], Any], dtype: torch.dtype
) -> None:
    env = SpaceEnv(space, emit=emit)
    wrapped = wrap_gymnasium(env)
    first = wrapped.reset()["observation"]
    assert first.dtype == dtype
    assert torch.equal(first, torch.as_tensor(np.array(env.current)).to(dtype))
    out = wrapped.step(TensorDict(action=torch.tensor(1)))
    assert out["observation"].dtype == dtype
    assert torch.equal(out["observation"], torch.as_tensor(np.array(env.current)).to(dtype))
    wrapped.close()


@pytest.mark.parametrize("one_hot", [False, True], ids=["index", "one_hot"])
def test_discrete_observation_of_any_integer_type(one_hot: bool) -> None:
    # Discrete.contains accepts any numpy integer scalar, e.g. np.int32
    env = SpaceEnv(spaces.Discrete(6, start=2), emit=lambda o: np.int32(o))
    wrapped = wrap_gymnasium(env, one_hot=one_hot)
    obs = wrapped.reset()["observation"]
    expected = torch.tensor(int(env.current) - 2)
    assert torch.equal(obs, F.one_hot(expected, 6) if one_hot else expected)
    wrapped.close()


# -- actions ------------------------------------------------------------------------------------


@dataclass
class ActCase:
    make: Callable[[], spaces.Space[Any]]
    one_hot: bool
    leaves: dict[Any, tuple[tuple[int, ...], torch.dtype, str]]
    # recorded action leaves -> the gymnasium action the env must have received
    to_gym: Callable[[dict[Any, torch.Tensor]], Any]


def _plain_obs() -> spaces.Box:
    return spaces.Box(-1.0, 1.0, (2,), np.float32)


def _arr(t: torch.Tensor, dtype: Any = None) -> np.ndarray:
    return t.numpy().astype(dtype) if dtype is not None else t.numpy()


ACT_CASES = {
    "discrete_start": ActCase(
        lambda: spaces.Discrete(4, start=-2),
        False,
        {"action": ((), torch.int64, "discrete")},
        lambda a: int(a["action"]) - 2,
    ),
    "discrete_start_one_hot": ActCase(
        lambda: spaces.Discrete(4, start=2),
        True,
        {"action": ((4,), torch.int64, "one_hot")},
        lambda a: int(a["action"].argmax()) + 2,
    ),
    "box_float32": ActCase(
        lambda: spaces.Box(np.array([-1.0, 0.5], np.float32), np.array([2.0, 0.75], np.float32)),
        False,
        {"action": ((2,), torch.float32, "box")},
        lambda a: _arr(a["action"]),
    ),
    "box_half_bounded": ActCase(
        lambda: spaces.Box(np.array([0.0, -np.inf]), np.array([np.inf, np.inf]), dtype=np.float64),
        False,
        {"action": ((2,), torch.float64, "box")},
        lambda a: _arr(a["action"]),
    ),
    "box_int": ActCase(
        lambda: spaces.Box(-3, 3, (2,), np.int64),
        False,
        {"action": ((2,), torch.int64, "box")},
        lambda a: _arr(a["action"]),
    ),
    "box_uint8": ActCase(
        lambda: spaces.Box(250, 255, (3,), np.uint8),
        False,
        {"action": ((3,), torch.uint8, "box")},
        lambda a: _arr(a["action"]),
    ),
    "multi_discrete_start": ActCase(
        lambda: spaces.MultiDiscrete([2, 5], start=[1, -3]),
        False,
        {"action": ((2,), torch.int64, "multi_discrete")},
        lambda a: _arr(a["action"]) + np.array([1, -3]),
    ),
    "multi_binary": ActCase(
        lambda: spaces.MultiBinary(4),
        False,
        {"action": ((4,), torch.int8, "binary")},
        lambda a: _arr(a["action"]),
    ),
    "dict": ActCase(
        lambda: spaces.Dict({"move": spaces.Box(-1.0, 1.0, (2,), np.float32), "fire": spaces.Discrete(3, start=1)}),
        False,
        {
            ("action", "fire"): ((), torch.int64, "discrete"),
            ("action", "move"): ((2,), torch.float32, "box"),
        },
        lambda a: {"fire": int(a[("action", "fire")]) + 1, "move": _arr(a[("action", "move")])},
    ),
    "tuple_nested": ActCase(
        lambda: spaces.Tuple((spaces.Discrete(3), spaces.Dict({"k": spaces.MultiBinary(2)}))),
        True,
        {
            ("action", "0"): ((3,), torch.int64, "one_hot"),
            ("action", "1", "k"): ((2,), torch.int8, "binary"),
        },
        lambda a: (int(a[("action", "0")].argmax()), {"k": _arr(a[("action", "1", "k")])}),
    ),
}


def _same_action(got: Any, want: Any) -> bool:
    if isinstance(want, dict):
        return isinstance(got, dict) and got.keys() == want.keys() and all(_same_action(got[k], want[k]) for k in want)
    if isinstance(want, tuple):
        return isinstance(got, tuple) and len(got) == len(want) and all(map(_same_action, got, want))
    return bool(np.array_equal(np.asarray(got), np.asarray(want)))


@pytest.mark.parametrize("name", list(ACT_CASES))
def test_action_spec(name: str) -> None:
    case = ACT_CASES[name]
    env = wrap_gymnasium(SpaceEnv(_plain_obs(), case.make()), one_hot=case.one_hot)
    assert {k: (s.shape, s.dtype, s.kind) for k, s in env.spec.action.items()} == case.leaves
    env.close()


@pytest.mark.parametrize("vector", [False, True], ids=["single", "vector"])
@pytest.mark.parametrize("name", list(ACT_CASES))
def test_random_actions_are_valid_and_reach_the_env(name: str, vector: bool) -> None:
    case = ACT_CASES[name]
    envs: list[SpaceEnv] = []
    n_rows, T = (3 if vector else 1), 40

    def make() -> BatchedEnv:
        envs[:] = [SpaceEnv(_plain_obs(), case.make(), seed=i) for i in range(n_rows)]
        if not vector:
            return wrap_gymnasium(envs[0], one_hot=case.one_hot)
        return wrap_gymnasium(gym.vector.SyncVectorEnv([(lambda e=e: e) for e in envs]), one_hot=case.one_hot)

    # SpaceEnv.step asserts action_space.contains(action) for every one of these actions
    with SyncDataCollector(make, frames_per_batch=n_rows * T, total_frames=2 * n_rows * T) as c:
        batches = list(c)
    for key, (shape, dtype, _) in case.leaves.items():
        for b in batches:
            assert b.get(key).shape == (*b.shape, *shape) and b.get(key).dtype == dtype
    for r, env in enumerate(envs):
        assert len(env.transitions) == 2 * T
        recorded = [b[r] if vector else b for b in batches]
        for i, (_, got, _) in enumerate(env.transitions):
            frame = recorded[i // T][i % T]
            want = case.to_gym({k: frame.get(k) for k in case.leaves})
            assert _same_action(got, want), f"row {r} frame {i}: env got {got!r}, batch says {want!r}"
    # the random actions are not constant
    flat = torch.cat([b.get(next(iter(case.leaves))).reshape(-1).double() for b in batches])
    assert flat.unique().numel() > 1


def test_explicit_actions_are_mapped_back_to_gymnasium_values() -> None:
    space = spaces.Dict({"d": spaces.Discrete(4, start=-2), "m": spaces.MultiDiscrete([3, 3], start=[5, 0])})
    env = SpaceEnv(_plain_obs(), space)
    wrapped = wrap_gymnasium(env, one_hot=True)
    wrapped.reset()
    wrapped.step(TensorDict({("action", "d"): F.one_hot(torch.tensor(3), 4), ("action", "m"): torch.tensor([2, 1])}))
    got = env.transitions[-1][1]
    assert got["d"] == 1 and got["m"].tolist() == [7, 1]
    wrapped.close()


def test_vector_explicit_actions_follow_rows() -> None:
    envs = [SpaceEnv(_plain_obs(), spaces.Discrete(5, start=10), seed=i) for i in range(3)]
    wrapped = wrap_gymnasium(gym.vector.SyncVectorEnv([(lambda e=e: e) for e in envs]))
    wrapped.reset()
    wrapped.step(TensorDict(action=torch.tensor([4, 0, 2]), batch_size=[3]))
    assert [int(e.transitions[-1][1]) for e in envs] == [14, 10, 12]
    wrapped.close()


# -- public reset / step -------------------------------------------------------------------------


def test_single_reset_and_step_tensordicts() -> None:
    env = SpaceEnv(spaces.Box(-1.0, 1.0, (3,), np.float32), spaces.Discrete(2), length=2)
    wrapped = wrap_gymnasium(env)
    td = wrapped.reset(seeds=[123])
    assert env.reset_seeds == [123]
    assert td.batch_size == torch.Size([]) and set(td.keys()) == {"observation"}
    first = td["observation"].clone()
    out = wrapped.step(TensorDict(action=torch.tensor(1)))
    assert out.batch_size == torch.Size([])
    assert set(out.keys()) == {"observation", "reward", "terminated", "truncated"}
    assert out["reward"].dtype == torch.float32 and float(out["reward"]) == 1.0
    assert out["terminated"].dtype == torch.bool and not bool(out["terminated"])
    assert out["truncated"].dtype == torch.bool
    out2 = wrapped.step(TensorDict(action=torch.tensor(0)))
    assert bool(out2["terminated"]) and float(out2["reward"]) == 2.0
    # results are not views of the adapter's reused buffers
    assert torch.equal(td["observation"], first)
    assert torch.equal(out["observation"], torch.from_numpy(env.transitions[0][2]))
    assert not torch.equal(out["observation"], out2["observation"])
    wrapped.close()
    assert env.closed


@pytest.mark.parametrize("mode", [AR.NEXT_STEP, AR.SAME_STEP, AR.DISABLED], ids=["next_step", "same_step", "disabled"])
def test_vector_reset_with_mask_resets_only_those_rows(mode: AR) -> None:
    envs = [SpaceEnv(spaces.Box(-1.0, 1.0, (2,), np.float32), length=100, seed=i) for i in range(3)]
    wrapped = wrap_gymnasium(gym.vector.SyncVectorEnv([(lambda e=e: e) for e in envs], autoreset_mode=mode))
    td = wrapped.reset(seeds=[1, 2, 3])
    assert td.batch_size == torch.Size([3])
    assert [e.reset_seeds for e in envs] == [[1], [2], [3]]
    wrapped.step(TensorDict(action=torch.tensor([0, 1, 0]), batch_size=[3]))
    out = wrapped.reset(mask=torch.tensor([False, True, False]))
    assert [len(e.reset_seeds) for e in envs] == [1, 2, 1]
    assert torch.equal(out["observation"][1], torch.from_numpy(envs[1].current))
    # the other rows keep their episodes going
    step = wrapped.step(TensorDict(action=torch.tensor([1, 1, 1]), batch_size=[3]))
    assert [e.t for e in envs] == [2, 1, 2]
    assert step["reward"].tolist() == [2.0, 1.0, 2.0]
    wrapped.close()


@pytest.mark.parametrize("mode", [AR.NEXT_STEP, AR.SAME_STEP, AR.DISABLED], ids=["next_step", "same_step", "disabled"])
def test_vector_step_reports_terminal_observation(mode: AR) -> None:
    envs = [SpaceEnv(spaces.Box(-1.0, 1.0, (2,), np.float32), length=k, seed=k) for k in (1, 3)]
    wrapped = wrap_gymnasium(gym.vector.SyncVectorEnv([(lambda e=e: e) for e in envs], autoreset_mode=mode))
    wrapped.reset()
    out = wrapped.step(TensorDict(action=torch.tensor([0, 0]), batch_size=[2]))
    assert out["terminated"].tolist() == [True, False]
    for r, env in enumerate(envs):
        assert torch.equal(out["observation"][r], torch.from_numpy(env.transitions[-1][2]))
    reset = wrapped.reset(mask=torch.tensor([True, False]))
    # the row starts over exactly once (SAME_STEP: gymnasium already did it inside step)
    assert envs[0].reset_seeds == [None, None] and envs[1].reset_seeds == [None]
    assert torch.equal(reset["observation"][0], torch.from_numpy(envs[0].current))
    envs[0].length = 10  # from now on the row's episode does not end by itself
    wrapped.step(TensorDict(action=torch.tensor([1, 1]), batch_size=[2]))
    assert [len(e.transitions) for e in envs] == [2, 2] and envs[0].t == 1
    # a later reset of the same row (say, a step limit), with no episode ending in between,
    # is a real reset: the earlier auto-reset must not be taken for a current one
    reset = wrapped.reset(mask=torch.tensor([True, False]))
    assert envs[0].reset_seeds == [None, None, None] and envs[0].t == 0
    assert torch.equal(reset["observation"][0], torch.from_numpy(envs[0].current))
    wrapped.close()


def test_collector_closes_the_gymnasium_env() -> None:
    envs, make = _vector(OBS_CASES["box_float32"], AR.NEXT_STEP, n=2)
    with SyncDataCollector(make, frames_per_batch=4, total_frames=8) as c:
        next(c)
        assert not any(e.closed for e in envs)
    assert all(e.closed for e in envs)


# -- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("obs_space", "act_space", "name"),
    [
        pytest.param(spaces.Text(8), spaces.Discrete(2), "Text", id="text_observation"),
        pytest.param(
            spaces.Box(0.0, 1.0, (2,)),
            spaces.Graph(spaces.Box(0.0, 1.0, (2,)), None),
            "Graph",
            id="graph_action",
        ),
        pytest.param(
            spaces.Dict({"ok": spaces.Discrete(2), "bad": spaces.Sequence(spaces.Discrete(2))}),
            spaces.Discrete(2),
            "Sequence",
            id="nested_sequence",
        ),
        pytest.param(
            spaces.Tuple((spaces.Discrete(2), spaces.Text(4))),
            spaces.Discrete(2),
            "Text",
            id="nested_text",
        ),
    ],
)
def test_unsupported_space_raises_type_error(obs_space: Any, act_space: Any, name: str) -> None:
    env = SpaceEnv(obs_space, act_space)
    with pytest.raises(TypeError, match=name):
        wrap_gymnasium(env)


@pytest.mark.anyio
async def test_unsupported_space_raises_through_the_collector() -> None:
    with pytest.raises(TypeError, match="Text"):
        async with Collector(lambda: SpaceEnv(spaces.Text(8)), frames_per_batch=4, total_frames=4) as c:
            await c.__anext__()


@pytest.mark.parametrize(
    ("value", "type_name"),
    [
        pytest.param(object(), "object", id="object"),
        pytest.param("CartPole-v1", "str", id="env_id"),
        pytest.param(spaces.Discrete(2), "Discrete", id="space"),
        pytest.param(lambda: SpaceEnv(spaces.Discrete(2)), "function", id="factory"),
    ],
)
def test_wrap_non_env_raises_type_error(value: Any, type_name: str) -> None:
    with pytest.raises(TypeError, match=rf"gymnasium\.Env.*got {type_name}"):
        wrap_gymnasium(value)


class _GradAction(torch.nn.Module):
    """A Box-action policy whose output needs grad and is float64 (the numpy fast path's fallbacks)."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.full((2,), 0.5, dtype=torch.float64))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        with torch.enable_grad():  # the collector runs policies under no_grad; this one insists
            return obs.double() * self.w


@pytest.mark.parametrize("vector", [False, True], ids=["single", "vector"])
def test_policy_actions_that_need_grad_are_cast_stored_and_sent(vector: bool) -> None:
    act = spaces.Box(-1.0, 1.0, (2,), np.float32)
    envs: list[SpaceEnv] = []

    def make() -> Any:
        envs[:] = [SpaceEnv(_plain_obs(), act, seed=i) for i in range(2 if vector else 1)]
        return gym.vector.SyncVectorEnv([(lambda e=e: e) for e in envs]) if vector else envs[0]

    with SyncDataCollector(make, _GradAction(), frames_per_batch=8, total_frames=8) as c:
        batch = next(iter(c))
    assert batch["action"].dtype == torch.float32 and not batch["action"].requires_grad
    torch.testing.assert_close(batch["action"], (batch["observation"].double() * 0.5).float())
    for r, env in enumerate(envs):
        frames = batch[r] if vector else batch
        sent = np.stack([np.asarray(a) for _, a, _ in env.transitions])
        assert sent.dtype == np.float32
        np.testing.assert_array_equal(sent, frames["action"].numpy())
