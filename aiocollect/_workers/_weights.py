"""Policy weights: their layout, checked state dicts, packed copies, and a shared block to publish them in."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .._core._shm import Layout, SharedBlock, layout_nbytes
from .._rollout._policy import require_materialized

_HEADER = [("header", (2,), torch.int64)]  # a WeightBlock's [seq, version]

__all__ = ["WeightBlock", "flat_state", "load_into", "pack_state", "state_of", "unpack_state", "weights_layout"]


def weights_layout(policy: Any) -> list[tuple[str, tuple[int, ...], torch.dtype]] | None:
    """The ``[(key, shape, dtype)]`` of an ``nn.Module``'s state dict; ``None`` for anything else.

    Raises:
        ValueError: The module has uninitialized lazy parameters (see `require_materialized`).
    """
    if not isinstance(policy, torch.nn.Module):
        return None
    require_materialized(policy, "its workers' copies")
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
    """The state dict named by ``source`` (module, state dict or TensorDict), checked against ``layout``.

    Raises:
        KeyError: An entry of the layout is missing.
        ValueError: An entry's shape is not the layout's.
    """
    state = flat_state(source)
    missing = {k for k, _, _ in layout} - set(state)
    if missing:
        raise KeyError(f"weights are missing entries {sorted(missing)}; pass the policy's full state dict")
    for k, shape, _ in layout:
        got = tuple(getattr(state[k], "shape", ()))
        if got != tuple(shape):
            raise ValueError(
                f"weights entry {k!r} must have the policy's shape {tuple(shape)}, got {got}; "
                "pass the state dict of a policy of the same architecture"
            )
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

    The block ends with two words, ``[seq, version]``: a seqlock. The engine (the one writer)
    makes ``seq`` odd, writes the weights and their version, and makes it even again; a worker
    copies the weights out and keeps the copy only if ``seq`` was even and unchanged around
    it, else copies again. So the engine can publish a new version while a worker is still
    loading the last one (a `MultiAsyncCollector` worker loads at the end of its batch, long
    after the update was sent), and no worker ever loads a torn mix of two versions.

    Args:
        layout: ``[(key, shape, dtype)]`` of the policy's state dict.
        fd: The block's memfd, in the worker that maps it (``None``: create the block).
    """

    _SPIN_LIMIT = 60.0  # seconds a reader waits for a write in progress (one copy of the weights)

    def __init__(self, layout: Layout, fd: int | None = None) -> None:
        self.layout = list(layout)
        body = layout_nbytes(self.layout)
        self.block = SharedBlock(body + layout_nbytes(_HEADER), fd)
        self.views = self.block.views(self.layout)
        # A numpy view: each word is read and written as one aligned 8-byte access.
        self._header = self.block.views(_HEADER, body)["header"].numpy()

    def copy_in(self, state: Any, version: int) -> None:
        """Write ``state`` (checked by `state_of`) as ``version`` (the engine's side)."""
        header = self._header
        header[0] += 1  # odd: readers wait, or copy again
        try:
            with torch.no_grad():
                for k, view in self.views.items():
                    view.copy_(state[k])
            header[1] = version
        finally:
            header[0] += 1

    def read(self, into: Callable[[dict[Any, torch.Tensor]], None], have: int | None) -> int:
        """Call ``into(views)`` on one whole version and return that version (a worker's side).

        ``have``: the version the caller already holds; if the block still holds it, ``into``
        is not called.

        Raises:
            RuntimeError: A write stayed in progress for a minute (the engine died while
                publishing).
        """
        header = self._header
        deadline: float | None = None
        while True:
            seq = int(header[0])
            if not seq & 1:
                version = int(header[1])
                if version != have:
                    into(self.views)
                if int(header[0]) == seq:
                    return version
            now = time.monotonic()
            if deadline is None:
                deadline = now + self._SPIN_LIMIT
            elif now > deadline:
                raise RuntimeError(
                    f"the policy weights were being written for {self._SPIN_LIMIT:.0f} s without end; the "
                    "collector that publishes them is gone"
                )
            time.sleep(0.0001)  # the engine is writing: one copy of the weights, usually microseconds

    def close(self) -> None:
        """Close the descriptor (workers that mapped the block keep their mapping)."""
        self.block.close_fd()
