"""`split_trajectories`: TorchRL's pad-split of a rollout batch, without importing TorchRL."""

from __future__ import annotations

import torch
from tensordict import NestedKey, TensorDictBase

from .._core._ragged import dense_parts, is_ragged

__all__ = ["split_trajectories"]


def split_trajectories(
    rollout_tensordict: TensorDictBase,
    *,
    prefix: NestedKey | None = None,
    trajectory_key: NestedKey | None = None,
    done_key: NestedKey | None = None,
    as_nested: bool | torch.layout = False,
) -> TensorDictBase:
    """Split a rollout into one zero-padded row per trajectory.

    A drop-in copy of ``torchrl.collectors.utils.split_trajectories``. The batch is flattened
    (all dims, row-major) into one sequence, consecutive frames with the same trajectory id
    form a trajectory, and each trajectory becomes one row of a ``[n_traj, max_len]`` result,
    right-padded with zeros. The input is never modified.

    Args:
        rollout_tensordict: A rollout whose trajectories are contiguous along the last batch
            dim, e.g. a collector batch of shape ``[T]`` or ``[*env_batch, T]``.
        prefix: Where to read ``"traj_ids"`` and write ``"mask"``. Defaults to
            ``"collector"`` if the input has a ``"collector"`` entry, else no prefix.
        trajectory_key: The key of the trajectory ids; supersedes ``prefix``. The mask is
            written next to it (its last element replaced by ``"mask"``).
        done_key: Used only when the ids are missing: ids are then derived from
            ``("next", done_key)`` (a new trajectory starts after each done step, and at each
            row of a multi-dim batch) and stored under the id key. Defaults to ``"done"``.
        as_nested: If true, return strided nested tensors of batch size ``[n_traj, -1]``
            instead of padding, and add no mask (TorchRL's behaviour; torch may warn that
            strided nested tensors are a prototype). ``torch.jagged`` is not supported, as
            TensorDict cannot validate jagged leaves against that size.

    Returns:
        A new tensordict of shape ``[n_traj, max_len]`` with a boolean mask entry, True on
        valid steps. If every trajectory already spans the whole last dim, the input (a
        shallow copy, dim names kept) is returned with an all-true mask instead, with a
        leading dim added if it was 1-D. The padded result has no dim names, as in TorchRL.

    Raises:
        ValueError: The input has no batch dim.
        KeyError: Neither the trajectory ids nor the done signal are in the input.
        NotImplementedError: ``as_nested`` is a layout other than ``torch.strided``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> obs = torch.cat([torch.arange(10), torch.arange(5)])
        >>> done = torch.zeros(15, dtype=torch.bool)
        >>> done[9] = True
        >>> data = TensorDict({"obs": obs, ("next", "done"): done}, batch_size=[15])
        >>> out = split_trajectories(data)
        >>> out.batch_size
        torch.Size([2, 10])
        >>> out["obs"]
        tensor([[0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
                [0, 1, 2, 3, 4, 0, 0, 0, 0, 0]])
        >>> out["mask"].sum(-1)
        tensor([10,  5])
        >>> out["traj_ids"][:, 0]
        tensor([0, 1])
    """
    td = rollout_tensordict
    if td.batch_dims == 0:
        raise ValueError(f"rollout_tensordict must have a batch dim, got batch_size={td.shape}")
    if trajectory_key is not None:
        traj_key = trajectory_key
        mask_key = (*trajectory_key[:-1], "mask") if isinstance(trajectory_key, tuple) else "mask"
    else:
        if prefix is None and "collector" in td.keys():
            prefix = "collector"
        traj_key = "traj_ids" if prefix is None else (prefix, "traj_ids")
        mask_key = "mask" if prefix is None else (prefix, "mask")

    done_key = "done" if done_key is None else done_key
    if is_ragged(td):
        # Parts of unequal shapes (workers asked for different frames_per_batch): frames are
        # read part by part, each row-major, as a dense stack along dim 0 would be read.
        flat = _flat_frames(td, traj_key, done_key)
        traj_ids = flat.get(traj_key)
        lengths = traj_ids.unique_consecutive(return_counts=True)[1]
    else:
        td = td.copy()  # shallow: new entries never reach the caller's tensordict
        traj_ids = td.get(traj_key, None)
        if traj_ids is None:
            traj_ids = _ids_from_done(td, traj_key, done_key)
            td.set(traj_key, traj_ids)
        # Run lengths of consecutive equal ids: one pass, no Python loop over frames.
        lengths = traj_ids.reshape(-1).unique_consecutive(return_counts=True)[1]
        if bool((lengths == td.shape[-1]).all()):
            td.set(mask_key, torch.ones(td.shape, dtype=torch.bool, device=traj_ids.device))
            return td.unsqueeze(0) if td.batch_dims == 1 else td
        flat = td.reshape(-1)
    n_traj, max_len = lengths.numel(), int(lengths.max())
    if as_nested:
        if isinstance(as_nested, torch.layout) and as_nested != torch.strided:
            raise NotImplementedError(
                f"as_nested={as_nested} is not supported; pass as_nested=True for strided nested tensors"
            )
        sizes = lengths.tolist()
        return flat.apply(
            lambda x: torch.nested.as_nested_tensor(list(x.split(sizes)), layout=torch.strided),
            batch_size=[n_traj, -1],
        )

    # Valid slots of the [n_traj, max_len] grid, read row-major, are exactly the flat frames
    # in order, so a single masked assignment per leaf does the split and the padding.
    mask = torch.arange(max_len, device=lengths.device) < lengths.unsqueeze(-1)

    def pad(x: torch.Tensor) -> torch.Tensor:
        out = x.new_zeros((n_traj, max_len, *x.shape[1:]))
        out[mask.to(x.device)] = x
        return out

    out = flat.apply(pad, batch_size=[n_traj, max_len])
    out.set(mask_key, mask.to(traj_ids.device))
    return out


def _flat_frames(td: TensorDictBase, traj_key: NestedKey, done_key: NestedKey) -> TensorDictBase:
    """A ragged ``td``'s frames as one ``[frames]`` sequence with trajectory ids, part by part.

    Ids derived from the done signal are numbered on from one part to the next, so no two
    parts share one; ids already there are kept.
    """
    flats, first_id = [], 0
    for part in dense_parts(td):
        part = part.copy()  # shallow: new entries never reach the caller's tensordict
        if part.get(traj_key, None) is None:
            ids = _ids_from_done(part, traj_key, done_key) + first_id
            part.set(traj_key, ids)
            first_id = int(ids.max()) + 1 if ids.numel() else first_id
        flats.append(part.reshape(-1))
    return torch.cat(flats, 0)


def _ids_from_done(td: TensorDictBase, traj_key: NestedKey, done_key: NestedKey) -> torch.Tensor:
    """Number trajectories from ``("next", done_key)``; every row of the batch starts a new one."""
    done = td.get(("next", done_key), None)
    if done is None:
        raise KeyError(
            f"no trajectory ids at {traj_key!r} and no done signal at {('next', done_key)!r}; "
            "pass trajectory_key= or done_key= naming an existing entry"
        )
    # [*batch] or [*batch, 1] (or any trailing shape: any element done means the frame is done)
    done = done.reshape(*td.shape, -1).any(-1).reshape(-1, td.shape[-1])
    # id within a row = number of done steps strictly before this one
    ids = torch.nn.functional.pad(done[:, :-1].long().cumsum(-1), (1, 0))
    # rows continue the numbering of the previous row: offset = sum of (previous rows' max + 1)
    row_span = ids[:, -1] + 1
    ids = ids + (row_span.cumsum(0) - row_span).unsqueeze(-1)
    return ids.reshape(td.shape)
