"""Policy weights: their layout, checked state dicts, packed copies, and a shared block to publish them in."""

from __future__ import annotations

import pickle
from collections.abc import Mapping
from typing import Any

import torch

from .._core._shm import Layout, SharedBlock, layout_nbytes

__all__ = ["WeightBlock", "flat_state", "load_into", "pack_state", "state_of", "unpack_state", "weights_layout"]


def weights_layout(policy: Any) -> list[tuple[str, tuple[int, ...], torch.dtype]] | None:
    """The ``[(key, shape, dtype)]`` of an ``nn.Module``'s state dict; ``None`` for anything else."""
    if not isinstance(policy, torch.nn.Module):
        return None
    return [(k, tuple(v.shape), v.dtype) for k, v in policy.state_dict().items()]


def flat_state(source: Any) -> dict[str, Any]:
    """``source`` (module, TensorDict, flat or nested mapping) as a flat ``{"a.b": tensor}`` state dict.

    A TensorDict of ``TensorDict.from_module`` and a nested mapping name entries as a state dict
    does once joined with ``"."``. Tensors are not copied.
    """
    if isinstance(source, torch.nn.Module):
        return dict(source.state_dict())
    if hasattr(source, "flatten_keys") and hasattr(source, "to_dict"):  # a TensorDict (tensordict not imported)
        return dict(source.flatten_keys(".").to_dict())
    if not isinstance(source, Mapping):
        raise TypeError(
            f"weights must be an nn.Module, a TensorDict or a state dict, got {type(source).__name__}; "
            "pass e.g. TensorDict.from_module(policy) or policy.state_dict()"
        )
    out: dict[str, Any] = {}
    for key, value in source.items():
        if isinstance(value, Mapping) or hasattr(value, "flatten_keys"):
            out.update({f"{key}.{k}": v for k, v in flat_state(value).items()})
        else:
            out[str(key)] = value
    return out


def state_of(layout: Layout, source: Any) -> dict[str, Any]:
    """The state dict named by ``source`` (module, state dict or TensorDict), checked against ``layout``."""
    state = flat_state(source)
    missing = {k for k, _, _ in layout} - set(state)
    if missing:
        raise KeyError(f"weights are missing entries {sorted(missing)}; pass the policy's full state dict")
    return state


def pack_state(state: Mapping[str, Any]) -> bytes:
    """A CPU copy of ``state``, pickled, to travel in a `LoadWeights` command (one worker's own weights)."""
    return pickle.dumps({k: torch.as_tensor(v).detach().to("cpu", copy=True) for k, v in state.items()})


def unpack_state(payload: bytes) -> dict[str, Any]:
    """The state dict `pack_state` packed."""
    return pickle.loads(payload)  # made by this collector's own engine, never by a peer


def load_into(policy: Any, source: Mapping[str, Any]) -> None:
    """Copy ``source`` into ``policy``'s parameters and buffers, in place (on their own devices)."""
    if not isinstance(policy, torch.nn.Module):
        raise TypeError(
            f"the worker's policy is a {type(policy).__name__}, not an nn.Module: it has no weights to load; "
            "build an nn.Module (e.g. a TensorDictModule) in policy_factory"
        )
    targets = policy.state_dict()
    missing = sorted(set(targets) - set(source))
    if missing:
        raise KeyError(f"weights are missing entries {missing} of the worker's policy; pass its full state dict")
    # state_dict() tensors share storage with the parameters and buffers: copy_ updates them.
    with torch.no_grad():
        for name, t in targets.items():
            t.copy_(source[name])


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
