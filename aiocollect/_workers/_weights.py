"""Policy weights: their layout, checked state dicts, and a shared block to publish them in."""

from __future__ import annotations

from typing import Any

import torch

from .._core._shm import Layout, SharedBlock, layout_nbytes

__all__ = ["WeightBlock", "state_of", "weights_layout"]


def weights_layout(policy: Any) -> list[tuple[str, tuple[int, ...], torch.dtype]] | None:
    """The ``[(key, shape, dtype)]`` of an ``nn.Module``'s state dict; ``None`` for anything else."""
    if not isinstance(policy, torch.nn.Module):
        return None
    return [(k, tuple(v.shape), v.dtype) for k, v in policy.state_dict().items()]


def state_of(layout: Layout, source: Any) -> dict[str, Any]:
    """The state dict named by ``source`` (module, state dict or TensorDict), checked against ``layout``."""
    if isinstance(source, torch.nn.Module):
        state = source.state_dict()
    elif hasattr(source, "flatten_keys") and hasattr(source, "to_dict"):  # a TensorDict
        state = source.flatten_keys(".").to_dict()
    else:
        state = dict(source)
    missing = {k for k, _, _ in layout} - set(state)
    if missing:
        raise KeyError(f"weights are missing entries {sorted(missing)}; pass the policy's full state dict")
    return state


class WeightBlock:
    """One shared block holding every parameter and buffer of the collection policy.

    Nothing is copied in until the first `copy_in`: a worker starts from the weights its
    pickled policy carries, and maps this block only when told to apply an update.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = list(layout)
        self.block = SharedBlock(layout_nbytes(self.layout))
        self.views = self.block.views(self.layout)

    def copy_in(self, state: Any) -> None:
        """Write ``state`` (a mapping with every key of the layout) into the shared block."""
        with torch.no_grad():
            for k, view in self.views.items():
                view.copy_(state[k])

    def close(self) -> None:
        """Close the descriptor (workers that mapped the block keep their mapping)."""
        self.block.close_fd()
