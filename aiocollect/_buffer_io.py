"""Saving and restoring a `ReplayBuffer`: ``state_dict`` in memory, ``dumps``/``loads`` on disk.

On disk a buffer is a directory holding ``state.pt`` (counters, validity mask, sampler and
RNG state, the layout with dtypes as strings so ``torch.load(weights_only=True)`` can read
it) and ``frames/``, one memory-mapped file per key, so a buffer larger than RAM is written
and read back without ever being loaded whole.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch

from ._storage import map_files

if TYPE_CHECKING:
    from ._buffer import ReplayBuffer

__all__ = ["BufferPersistence", "dumps", "load_state_dict", "loads", "state_dict"]

_FORMAT = 1


def _dtype(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a saved buffer")
    return dtype


def _meta(rb: ReplayBuffer) -> dict[str, Any]:
    st = rb.storage
    return {
        "format": _FORMAT,
        "capacity": rb.capacity,
        "storage_capacity": st.capacity,
        "ndim": st.ndim,
        "row_length": st.row_length,
        "layout": [(list(k) if isinstance(k, tuple) else k, list(shape), str(dtype)) for k, shape, dtype in st.layout],
        "valid": rb._valid.clone(),
        "cursor": rb._cursor,
        "size": rb._size,
        "written": rb._written,
        "sampled": rb._sampled,
        "policy_version": rb._policy_version,
        "stale_dropped": rb._stale_dropped,
        "sampler": rb.sampler.state_dict(),
        "generator": rb._generator.get_state(),
    }


def _restore(rb: ReplayBuffer, meta: dict[str, Any]) -> Any:
    if meta.get("format") != _FORMAT:
        raise ValueError(f"unsupported buffer state format {meta.get('format')!r}; expected {_FORMAT}")
    if meta["capacity"] != rb.capacity or meta["ndim"] != rb.storage.ndim:
        raise ValueError(
            f"the saved buffer has capacity {meta['capacity']} and ndim {meta['ndim']}, this one "
            f"{rb.capacity} and {rb.storage.ndim}; create the buffer with the same arguments"
        )
    layout = [(tuple(k) if isinstance(k, list) else k, tuple(shape), _dtype(d)) for k, shape, d in meta["layout"]]
    if not layout:
        return layout
    rb.build(layout, meta["row_length"] or 1)
    if rb.storage.layout != layout:
        raise ValueError("the saved buffer stores different keys, shapes or dtypes than this one")
    return layout


def _set_counters(rb: ReplayBuffer, meta: dict[str, Any]) -> None:
    rb._valid = meta["valid"].clone() if meta["layout"] else rb._valid
    rb._num_valid = int(rb._valid.sum())
    rb._cursor, rb._size = int(meta["cursor"]), int(meta["size"])
    rb._written, rb._sampled = int(meta["written"]), int(meta["sampled"])
    rb._policy_version, rb._stale_dropped = int(meta["policy_version"]), int(meta["stale_dropped"])
    rb.sampler.load_state_dict(meta["sampler"])
    rb._generator.set_state(meta["generator"])


def _check_idle(rb: ReplayBuffer, what: str) -> None:
    if rb._in_flight:
        raise RuntimeError(f"{what} while {rb._in_flight} frames are being written; pause the collectors first")


def state_dict(rb: ReplayBuffer) -> dict[str, Any]:
    with rb._lock:
        _check_idle(rb, "state_dict() called")
        state = _meta(rb)
        state["frames"] = {k: t.clone() for k, t in rb.storage.tensors.items()}
        return state


def load_state_dict(rb: ReplayBuffer, state: dict[str, Any]) -> None:
    with rb._lock:
        _check_idle(rb, "load_state_dict() called")
        _restore(rb, state)
        for k, t in rb.storage.tensors.items():
            t.copy_(state["frames"][k])
        _set_counters(rb, state)


def dumps(rb: ReplayBuffer, path: str) -> None:
    os.makedirs(path, exist_ok=True)
    with rb._lock:
        _check_idle(rb, "dumps() called")
        meta = _meta(rb)
        st = rb.storage
        target = os.path.join(path, "frames")
        if st.built and os.path.realpath(getattr(st, "path", "") or "") != os.path.realpath(target):
            os.makedirs(target, exist_ok=True)
            files = map_files(target, [(k, tuple(t.shape), t.dtype) for k, t in st.tensors.items()])
            for k, t in st.tensors.items():
                files[k].copy_(t)
            del files  # unmapping flushes the pages to the files
        torch.save(meta, os.path.join(path, "state.pt"))


def loads(rb: ReplayBuffer, path: str) -> None:
    file = os.path.join(path, "state.pt")
    if not os.path.exists(file):
        raise FileNotFoundError(f"no saved buffer in {path!r} (state.pt is missing); pass a directory written by dumps()")
    meta = torch.load(file, weights_only=True)
    with rb._lock:
        _check_idle(rb, "loads() called")
        layout = _restore(rb, meta)
        st = rb.storage
        if layout and os.path.realpath(getattr(st, "path", "") or "") != os.path.realpath(os.path.join(path, "frames")):
            files = map_files(os.path.join(path, "frames"), [(k, tuple(t.shape), t.dtype) for k, t in st.tensors.items()])
            for k, t in st.tensors.items():
                t.copy_(files[k])
        _set_counters(rb, meta)


class BufferPersistence:
    """The persistence methods of `ReplayBuffer` (a mixin, so the buffer module stays small)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: frames, validity, counters, sampler and RNG state."""
        return state_dict(self)  # type: ignore[arg-type]

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict` (the capacity and layout must match)."""
        load_state_dict(self, state)  # type: ignore[arg-type]
        self._notifier.notify_all()  # type: ignore[attr-defined]

    def dumps(self, path: str) -> None:
        """Write the buffer (frames as memory-mapped files, plus its state) to directory ``path``."""
        dumps(self, path)  # type: ignore[arg-type]

    def loads(self, path: str) -> None:
        """Restore a buffer written by `dumps` (the frame files are mapped, then copied in)."""
        loads(self, path)  # type: ignore[arg-type]
        self._notifier.notify_all()  # type: ignore[attr-defined]
