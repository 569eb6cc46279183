"""The layout of one batch: its leaves, and what a dict of leaves alone cannot say.

Worker processes write batches into shared slots laid out leaf by leaf (``(key, shape,
dtype)``); the parent wraps the slot's tensors back into a TensorDict. A TorchRL env's
batch may hold nested TensorDicts with batch dims of their own (an agent group
``[*B, T, n_agents]``): `BatchLayout.nested` records them so the parent restores them. A batch
with no fixed layout (lazily stacked heterogeneous envs, dynamic shapes, non-tensor entries)
is marked ``pickled``: it travels whole with its ``BatchReady`` event instead.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BatchLayout", "nested_batch_dims", "restore_nested"]


class BatchLayout(list[Any]):
    """``[(key, shape, dtype)]`` of one batch's leaves, shapes ``[*env_batch, T, ...]``.

    A list, so transports that allocate slots from it need nothing else.

    Attributes:
        shape: The batch shape ``[*env_batch, T]``.
        nested: ``{nested key: batch shape}`` of the nested TensorDicts whose batch has more
            dims than the batch's own.
        pickled: Batches have no fixed layout and travel whole, pickled.
        hidden: Keys the collector keeps for itself and leaves out of what it delivers
            (``("collector", "policy_version")`` and ``("collector", "worker_id")`` of a TorchRL
            env's batches, unless ``track_provenance=True``).
    """

    def __init__(
        self,
        leaves: Any = (),
        *,
        shape: tuple[int, ...],
        nested: dict[Any, tuple[int, ...]] | None = None,
        pickled: bool = False,
        hidden: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(leaves)
        self.shape = tuple(shape)
        self.nested = dict(nested or {})
        self.pickled = pickled
        self.hidden = tuple(hidden)


def nested_batch_dims(td: Any) -> dict[Any, tuple[int, ...]]:
    """The nested TensorDicts of ``td`` whose batch has more dims than ``td``'s, by key."""
    from tensordict import TensorDictBase

    root = td.batch_dims
    found: dict[Any, tuple[int, ...]] = {}
    for key, value in td.items(include_nested=True):
        if isinstance(value, TensorDictBase) and value.batch_dims > root:
            found[key] = tuple(value.batch_size)
    return found


def restore_nested(td: Any, layout: Any) -> Any:
    """Give ``td`` (built from a slot's leaves) the nested batch dims ``layout`` records."""
    nested = getattr(layout, "nested", None)
    if nested:
        # Outer groups first: a group's batch must be set before its own sub-groups'.
        for key in sorted(nested, key=lambda k: 1 if isinstance(k, str) else len(k)):
            td.get(key).batch_size = nested[key]
    return td
