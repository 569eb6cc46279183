"""Ragged batches: lazy stacks of parts with unequal shapes, and how to count and read them.

Workers asked for different ``frames_per_batch`` (a list), or nodes whose envs have
different batch sizes, deliver batches of unequal shapes. Stacked, as TorchRL stacks them,
they form a `LazyStackedTensorDict` whose batch size has ``-1`` where the parts differ
(``[2, 2, -1]``): its ``numel()`` counts nothing useful, it cannot be reshaped, and its
last dim is no length. Whatever counts, writes or splits such a batch reads it part by
part, in order, as a dense stack along dim 0 would be read.
"""

from __future__ import annotations

import torch
from tensordict import LazyStackedTensorDict, TensorDictBase

__all__ = ["dense_parts", "frame_count", "is_ragged", "joined_frames"]

_VERSION = ("collector", "policy_version")


def is_ragged(batch: TensorDictBase) -> bool:
    """Whether ``batch`` is a lazy stack along dim 0 of parts with unequal shapes (at any depth)."""
    if not isinstance(batch, LazyStackedTensorDict) or batch.stack_dim != 0:
        return False
    first = batch.tensordicts[0].shape
    return any(part.shape != first or is_ragged(part) for part in batch.tensordicts)


def dense_parts(batch: TensorDictBase) -> list[TensorDictBase]:
    """``batch``'s parts in order, each with one shape: ``[batch]`` itself if it is not ragged."""
    if not is_ragged(batch):
        return [batch]
    return [dense for part in batch.tensordicts for dense in dense_parts(part)]


def frame_count(batch: TensorDictBase, *, taken_only: bool = False) -> int:
    """The frames in ``batch``, counted part by part where it is ragged.

    With ``taken_only``, only the steps taken count (a preempted worker's others have policy
    version ``-1``).
    """
    if taken_only:
        return sum(int((part.get(_VERSION) >= 0).sum()) for part in dense_parts(batch))
    return sum(int(part.numel()) for part in dense_parts(batch))


def joined_frames(batch: TensorDictBase, *, rows: bool) -> TensorDictBase:
    """A ragged batch's frames as one dense batch, in the order `dense_parts` reads them.

    ``rows=False`` gives ``[n_frames]``; ``rows=True`` keeps each part's last (time) dim and
    gives ``[n_rows, T]``, which needs every part to have the same ``T``.

    Raises:
        ValueError: ``rows=True`` and the parts' time lengths differ (or a part has no dims).
    """
    # A part may itself be a (dense) lazy stack, whose reshape stays lazy: make each dense.
    parts = [part.contiguous() if isinstance(part, LazyStackedTensorDict) else part for part in dense_parts(batch)]
    if not rows:
        return torch.cat([part.reshape(-1) for part in parts], 0)
    lengths = sorted({part.shape[-1] if part.batch_dims else 0 for part in parts})
    if len(lengths) > 1 or lengths == [0]:
        shapes = [list(part.shape) for part in parts]
        raise ValueError(
            f"rows of one time length cannot hold the parts of this ragged batch (shapes {shapes}); "
            "extend with one part at a time, or store frames (ndim=1)"
        )
    return torch.cat([part.reshape(-1, lengths[0]) for part in parts], 0)
