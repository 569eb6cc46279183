"""Tests for `aiocollect._collect._split.split_trajectories`.

The comparison tests check every key, shape, dtype, value, dim name and the mask against
TorchRL's own ``split_trajectories``; they are skipped when torchrl is not installed. The other
tests need only torch and tensordict.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import pytest
import torch
from tensordict import LazyStackedTensorDict, TensorDict, TensorDictBase

from aiocollect._collect._split import split_trajectories

# Importing torchrl.collectors warns about its own legacy weight updaters (see pyproject.toml).
_TORCHRL_IMPORT_WARNING = "Creating \\w+ which inherits from WeightUpdaterBase is deprecated"
# torch warns (once per process) whenever a strided nested tensor is built.
_NESTED_PROTOTYPE_WARNING = "ignore:The PyTorch API of nested tensors is in prototype stage"

Split = Callable[..., TensorDictBase]


@pytest.fixture
def torchrl_split() -> Split:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", _TORCHRL_IMPORT_WARNING, DeprecationWarning)
        pytest.importorskip("torchrl")
        from torchrl.collectors.utils import split_trajectories as reference
    return reference


def _ids_from_lengths(lengths: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def _done_from_ids(ids: torch.Tensor) -> torch.Tensor:
    """True on the last frame of each run of equal ids (along the last dim)."""
    done = torch.zeros(ids.shape, dtype=torch.bool)
    done[..., :-1] = ids[..., 1:] != ids[..., :-1]
    return done


def _collector_batch(traj_ids: torch.Tensor, names: list[str | None] | None = None) -> TensorDict:
    """A batch with TorchRL's collector key layout and the given ``("collector", "traj_ids")``."""
    shape = traj_ids.shape
    gen = torch.Generator().manual_seed(0)
    return TensorDict(
        {
            "observation": torch.randn(*shape, 3, generator=gen),
            "action": torch.randint(0, 4, shape, generator=gen),
            ("next", "observation"): torch.randn(*shape, 3, generator=gen),
            ("next", "reward"): torch.randn(*shape, 1, generator=gen),
            ("next", "done"): _done_from_ids(traj_ids).unsqueeze(-1),
            ("collector", "traj_ids"): traj_ids.to(torch.int64),
        },
        batch_size=shape,
        names=names,
    )


def _assert_same(actual: TensorDictBase, expected: TensorDictBase) -> None:
    assert actual.batch_size == expected.batch_size
    assert actual.names == expected.names
    keys = set(actual.keys(True, True))
    assert keys == set(expected.keys(True, True))
    for key in keys:
        a, e = actual.get(key), expected.get(key)
        assert a.dtype == e.dtype, key
        if e.is_nested:
            assert a.is_nested, key
            assert len(a.unbind()) == len(e.unbind()), key
            for a_row, e_row in zip(a.unbind(), e.unbind(), strict=True):
                torch.testing.assert_close(a_row, e_row, rtol=0, atol=0, msg=str(key))
        else:
            assert a.shape == e.shape, key
            torch.testing.assert_close(a, e, rtol=0, atol=0, msg=str(key))


def _compare(reference: Split, data: TensorDict, **kwargs: object) -> TensorDictBase:
    before = data.clone()
    out = split_trajectories(data, **kwargs)
    _assert_same(data, before)  # the input is left untouched
    _assert_same(out, reference(data.clone(), **kwargs))
    return out


# -- comparison with TorchRL -------------------------------------------------------------------


@pytest.mark.parametrize("lengths", [[3, 7, 1, 5], [1, 1, 1], [12], [4, 4, 2], [2, 9]], ids=lambda v: repr(v))
def test_matches_torchrl_1d(torchrl_split: Split, lengths: list[int]) -> None:
    data = _collector_batch(_ids_from_lengths(lengths), names=["time"])
    out = _compare(torchrl_split, data)
    assert out["collector", "mask"].sum(-1).tolist() == (lengths if len(lengths) > 1 else [lengths[0]])


@pytest.mark.parametrize("seed", range(6))
def test_matches_torchrl_2d_env_time(torchrl_split: Split, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    num_envs, time = 3, 8
    done = torch.rand(num_envs, time, generator=gen) < 0.25
    # collector ids: unique across envs, a trajectory may span the batch's start or end
    ids = torch.nn.functional.pad(done[:, :-1].long().cumsum(-1), (1, 0))
    ids = ids + torch.arange(num_envs).unsqueeze(-1) * time
    out = _compare(torchrl_split, _collector_batch(ids, names=[None, "time"]))
    assert out["collector", "mask"].sum() == num_envs * time


@pytest.mark.parametrize("shape", [(10,), (3, 5), (2, 2, 4)])
def test_matches_torchrl_full_length(torchrl_split: Split, shape: tuple[int, ...]) -> None:
    ids = torch.arange(torch.Size(shape[:-1]).numel()).reshape(shape[:-1]).unsqueeze(-1)
    names = [None] * (len(shape) - 1) + ["time"]
    out = _compare(torchrl_split, _collector_batch(ids.expand(shape).clone(), names=names))
    expected_shape = shape if len(shape) > 1 else (1, *shape)
    assert out.batch_size == expected_shape
    assert out.names[-1] == "time"
    assert out["collector", "mask"].all()


@pytest.mark.parametrize(
    ("shape", "done_at", "trailing_one"),
    [
        ((15,), [[9]], False),
        ((15,), [[2, 3, 11]], True),
        ((15,), [[14]], True),  # done on the last frame only: a single full-length trajectory
        ((3, 6), [[1, 5], [], [0, 2, 3]], True),
        ((2, 7), [[6], [3]], False),
    ],
)
def test_matches_torchrl_done_derivation(
    torchrl_split: Split, shape: tuple[int, ...], done_at: list[list[int]], trailing_one: bool
) -> None:
    done = torch.zeros(shape, dtype=torch.bool).reshape(-1, shape[-1])
    for row, steps in enumerate(done_at):
        done[row, steps] = True
    done = done.reshape(shape)
    data = TensorDict(
        {
            "obs": torch.arange(done.numel(), dtype=torch.float32).reshape(shape),
            ("next", "done"): done.unsqueeze(-1) if trailing_one else done,
        },
        batch_size=shape,
    )
    out = _compare(torchrl_split, data)
    assert out["traj_ids"].dtype == torch.int64


def test_matches_torchrl_custom_done_key(torchrl_split: Split) -> None:
    done = torch.zeros(2, 6, 1, dtype=torch.bool)
    done[0, 2] = done[1, 0] = True
    data = TensorDict({"obs": torch.arange(12).reshape(2, 6), ("next", "agent", "terminated"): done}, [2, 6])
    _compare(torchrl_split, data, done_key=("agent", "terminated"))


@pytest.mark.parametrize("trajectory_key", ["trajectory", ("meta", "episode")])
def test_matches_torchrl_trajectory_key(torchrl_split: Split, trajectory_key: str | tuple[str, str]) -> None:
    data = _collector_batch(_ids_from_lengths([2, 5, 3, 6]).reshape(2, 8))
    data.set(trajectory_key, data.get(("collector", "traj_ids")).int() + 100)
    out = _compare(torchrl_split, data, trajectory_key=trajectory_key)
    mask_key = "mask" if isinstance(trajectory_key, str) else ("meta", "mask")
    assert out.get(mask_key).sum(-1).tolist() == [2, 5, 3, 6]
    assert ("collector", "mask") not in out.keys(True)


def test_matches_torchrl_prefix(torchrl_split: Split) -> None:
    data = TensorDict({"obs": torch.arange(9), ("meta", "traj_ids"): _ids_from_lengths([4, 5])}, [9])
    _compare(torchrl_split, data, prefix="meta")


@pytest.mark.filterwarnings(_NESTED_PROTOTYPE_WARNING)
def test_matches_torchrl_as_nested(torchrl_split: Split) -> None:
    data = _collector_batch(_ids_from_lengths([3, 3, 4, 2]).reshape(2, 6))
    out = _compare(torchrl_split, data, as_nested=True)
    assert out.batch_size == torch.Size([4, -1])


# -- standalone (no torchrl) -------------------------------------------------------------------


def _docstring_data() -> TensorDict:
    done = torch.zeros(15, dtype=torch.bool)
    done[9] = True
    trajectory = torch.cat([torch.zeros(10, dtype=torch.int32), torch.ones(5, dtype=torch.int32)])
    return TensorDict(
        {
            "obs": torch.cat([torch.arange(10), torch.arange(5)]),
            ("next", "obs"): torch.cat([torch.arange(1, 11), torch.arange(1, 6)]),
            ("next", "done"): done,
            "trajectory": trajectory,
        },
        batch_size=[15],
    )


_DOC_MASK = [[True] * 10, [True] * 5 + [False] * 5]


def test_docstring_example_from_done() -> None:
    out = split_trajectories(_docstring_data(), done_key="done")
    assert out.batch_size == torch.Size([2, 10])
    assert set(out.keys(True, True)) == {
        "mask",
        "obs",
        "traj_ids",
        "trajectory",
        ("next", "done"),
        ("next", "obs"),
    }
    assert out["mask"].dtype == torch.bool
    assert out["mask"].tolist() == _DOC_MASK
    assert out["obs"].tolist() == [list(range(10)), [0, 1, 2, 3, 4, 0, 0, 0, 0, 0]]
    assert out["next", "obs"].tolist() == [list(range(1, 11)), [1, 2, 3, 4, 5, 0, 0, 0, 0, 0]]
    assert (out["traj_ids"] == out["trajectory"]).all()
    assert out["traj_ids"].dtype == torch.int64
    assert out["trajectory"].dtype == torch.int32
    assert out.names == [None, None]


def test_docstring_example_trajectory_key() -> None:
    out = split_trajectories(_docstring_data(), trajectory_key="trajectory")
    assert "traj_ids" not in out.keys()
    assert out["mask"].tolist() == _DOC_MASK
    assert out["next", "done"].tolist() == [[False] * 9 + [True], [False] * 10]


def test_collector_batch_shape() -> None:
    # 12 frames, trajectories truncated every 5 steps: rows of 5, 5 and 2 frames
    data = _collector_batch(_ids_from_lengths([5, 5, 2]))
    out = split_trajectories(data)
    assert out.batch_size == torch.Size([3, 5])
    assert out["collector", "mask"].int().tolist() == [[1] * 5, [1] * 5, [1, 1, 0, 0, 0]]
    assert out["next", "reward"].shape == (3, 5, 1)
    assert out["next", "reward"][2, 2:].eq(0).all()
    torch.testing.assert_close(out["observation"][1], data["observation"][5:10])


def test_full_length_keeps_names_and_adds_mask() -> None:
    data = _collector_batch(torch.arange(2).unsqueeze(-1).expand(2, 4).clone(), [None, "time"])
    out = split_trajectories(data)
    assert out.batch_size == (2, 4)
    assert out.names == [None, "time"]
    assert out["collector", "mask"].all()
    assert ("collector", "mask") not in data.keys(True)  # the input is not modified
    out_1d = split_trajectories(data[0].refine_names("time"))
    assert out_1d.batch_size == (1, 4)
    assert out_1d.names == [None, "time"]


def test_done_ids_restart_per_row() -> None:
    # TorchRL offsets derived ids only along the first dim, so with 3 batch dims rows [0, 0]
    # and [0, 1] share ids (merged, or a split error); here every row starts a new trajectory.
    data = TensorDict({("next", "done"): torch.zeros(2, 2, 3, 1, dtype=torch.bool)}, [2, 2, 3])
    data["next", "done"][1, 0, 0] = True
    out = split_trajectories(data)
    assert out.batch_size == (5, 3)
    assert out["traj_ids"].tolist() == [[0, 0, 0], [1, 1, 1], [2, 0, 0], [3, 3, 0], [4, 4, 4]]
    assert out["mask"].sum(-1).tolist() == [3, 3, 1, 2, 3]


def test_repeated_id_starts_new_trajectory() -> None:
    # TorchRL counts every frame with a given id (a split error); each run is its own row here.
    data = TensorDict({"traj_ids": torch.tensor([7, 7, 3, 7, 7, 7])}, [6])
    out = split_trajectories(data)
    assert out["traj_ids"].tolist() == [[7, 7, 0], [3, 0, 0], [7, 7, 7]]
    assert out["mask"].sum(-1).tolist() == [2, 1, 3]


@pytest.mark.filterwarnings(_NESTED_PROTOTYPE_WARNING)
def test_as_nested_pads_back_to_split() -> None:
    data = _collector_batch(_ids_from_lengths([3, 1, 4, 2, 2]).reshape(2, 6))
    nested = split_trajectories(data, as_nested=True)
    assert ("collector", "mask") not in nested.keys(True)
    assert [len(row) for row in nested["action"].unbind()] == [3, 1, 4, 2, 2]
    padded = nested.to_padded_tensor(mask_key=("collector", "mask"))
    _assert_same(padded, split_trajectories(data))


def test_as_nested_jagged_is_rejected() -> None:
    data = TensorDict({"traj_ids": _ids_from_lengths([1, 2])}, [3])
    with pytest.raises(NotImplementedError, match=r"^as_nested=torch\.jagged is not supported"):
        split_trajectories(data, as_nested=torch.jagged)


def test_missing_ids_and_done() -> None:
    with pytest.raises(KeyError, match="no trajectory ids at 'traj_ids'"):
        split_trajectories(TensorDict({"obs": torch.zeros(4)}, [4]))


def test_zero_dim_input() -> None:
    with pytest.raises(ValueError, match=r"^rollout_tensordict must have a batch dim"):
        split_trajectories(TensorDict({"traj_ids": torch.tensor(0)}, []))


# -- parts of unequal shapes (workers asked for different frames_per_batch) ----------------------
def test_a_ragged_stack_splits_as_its_parts_read_in_order() -> None:
    # Worker 0: 2 envs x 2 steps; worker 1: 2 envs x 5 steps; ids unique across workers.
    first = _collector_batch(torch.tensor([[0, 0], [2, 2]]))
    second = _collector_batch(torch.tensor([[1, 1, 1, 3, 3], [5, 5, 5, 5, 5]]))
    before = [first.clone(), second.clone()]
    out = split_trajectories(LazyStackedTensorDict.lazy_stack([first, second], 0))
    for part, copy in zip([first, second], before, strict=True):
        _assert_same(part, copy)  # the input is left untouched
    # The same frames as one flat run give the same trajectories.
    flat = torch.cat([first.reshape(-1), second.reshape(-1)], 0)
    _assert_same(out, split_trajectories(flat))
    assert out["collector", "mask"].sum(-1).tolist() == [2, 2, 3, 2, 5]


def test_a_ragged_stack_without_ids_numbers_each_parts_rows_apart() -> None:
    done = [torch.zeros(1, 3, 1, dtype=torch.bool), torch.zeros(2, 2, 1, dtype=torch.bool)]
    done[1][0, 0] = True
    parts = [TensorDict({("next", "done"): d, "obs": torch.ones(d.shape[:-1])}, d.shape[:-1]) for d in done]
    out = split_trajectories(LazyStackedTensorDict.lazy_stack(parts, 0))
    # Rows: part 0's one row; part 1's row 0 ends an episode after its first step, then row 1.
    assert out["traj_ids"].tolist() == [[0, 0, 0], [1, 0, 0], [2, 0, 0], [3, 3, 0]]
    assert out["mask"].sum(-1).tolist() == [3, 1, 1, 2]
