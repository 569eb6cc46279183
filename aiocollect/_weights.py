"""The policy's weights in shared memory: the parent writes them, workers copy them in."""

from __future__ import annotations

from typing import Any

import torch
from tensordict import TensorDictBase

from ._shm import SharedBlock, layout_nbytes

__all__ = ["WeightBlock"]


class WeightBlock:
    """One shared block holding every parameter and buffer of the collection policy."""

    def __init__(self, policy: torch.nn.Module) -> None:
        state = policy.state_dict()
        self.layout = [(k, tuple(v.shape), v.dtype) for k, v in state.items()]
        self.block: SharedBlock | None = SharedBlock(layout_nbytes(self.layout))
        self.views = self.block.views(self.layout)
        self.copy_in(state)

    @classmethod
    def for_policy(cls, policy: Any) -> WeightBlock | None:
        """A block for an ``nn.Module`` policy; ``None`` for anything else (nothing to sync)."""
        return cls(policy) if isinstance(policy, torch.nn.Module) else None

    def state_of(self, source: Any) -> dict[str, Any]:
        """The state dict named by ``source`` (module, state dict or TensorDict), checked for completeness."""
        if isinstance(source, torch.nn.Module):
            state = source.state_dict()
        elif isinstance(source, TensorDictBase):
            state = source.flatten_keys(".").to_dict()
        else:
            state = dict(source)
        missing = set(self.views) - set(state)
        if missing:
            raise KeyError(f"weights are missing entries {sorted(missing)}; pass the policy's full state dict")
        return state

    def copy_in(self, state: dict[str, Any]) -> None:
        """Write ``state`` into the shared block."""
        with torch.no_grad():
            for k, view in self.views.items():
                view.copy_(state[k])

    def close(self) -> None:
        """Close the descriptor (workers that mapped the block keep their mapping)."""
        if self.block is not None:
            self.block.close_fd()
