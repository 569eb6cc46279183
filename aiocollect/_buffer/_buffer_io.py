"""Saving and restoring a `ReplayBuffer`: ``state_dict`` in memory, ``dumps``/``loads`` on disk.

On disk a buffer is a directory holding ``state.pt`` (counters, validity mask, sampler and
RNG state, the layout with dtypes as strings so ``torch.load(weights_only=True)`` can read
it) and ``frames/``, one memory-mapped file per key, so a buffer larger than RAM is written
and read back without ever being loaded whole.

Loading is check-then-apply: `_check` (and the frame checks) look at everything a state
must match or hold, and raise before the buffer is touched; only then does `_restore`
build the storage and copy the state in. A refused load leaves the buffer as it was.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch

from ._samplers import Sampler
from ._storage import _file_name, map_files

__all__ = ["BufferPersistence", "dumps", "load_state_dict", "loads", "state_dict"]

_FORMAT = 1
# Every entry of a saved state but "sampler_class" (added later: older states lack it).
_ENTRIES = (
    "format", "capacity", "storage_capacity", "ndim", "row_length", "layout", "valid", "cursor", "size",
    "written", "sampled", "policy_version", "stale_dropped", "sampler", "generator",
)  # fmt: skip
_FROM_STATE_DICT = "pass a dict returned by ReplayBuffer.state_dict()"
_FROM_DUMPS = "pass a directory written by ReplayBuffer.dumps()"

Layout = list[tuple[Any, tuple[int, ...], torch.dtype]]
# The ReplayBuffer being saved or restored. Not imported: _buffer imports this module, and
# the layering rule allows no cycle, even one only a type checker follows.
Buffer = Any


def _class_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _meta(rb: Buffer) -> dict[str, Any]:
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
        "sampler_class": _class_name(type(rb.sampler)),
        "sampler": rb.sampler.state_dict(),
        "generator": rb._generator.get_state(),
    }


def _layout(meta: dict[str, Any], fix: str) -> Layout:
    try:
        entries = [(k, tuple(int(n) for n in shape), str(name)) for k, shape, name in meta["layout"]]
    except (TypeError, ValueError) as exc:
        raise ValueError(f"the saved buffer state is damaged: its layout is unreadable ({exc}); {fix}") from exc
    layout = []
    for k, shape, name in entries:
        dtype = getattr(torch, name.removeprefix("torch."), None)
        if not isinstance(dtype, torch.dtype):
            unknown = f"the saved buffer stores an unknown dtype {name!r}"
            raise ValueError(f"{unknown}; load it with the torch version that saved it")
        layout.append((tuple(k) if isinstance(k, list) else k, shape, dtype))
    return layout


def _mismatches(rb: Buffer, meta: dict[str, Any], layout: Layout) -> tuple[list[str], list[str]]:
    """Where the saved buffer differs from ``rb``: (clauses, what to create alike)."""
    problems: list[str] = []
    alike: list[str] = []
    if meta["capacity"] != rb.capacity:
        problems.append(f"the saved buffer has capacity {meta['capacity']!r}, this one {rb.capacity}")
        alike.append("capacity")
    if meta["ndim"] != rb.storage.ndim:
        problems.append(f"the saved buffer's storage has ndim {meta['ndim']!r}, this one {rb.storage.ndim}")
        alike.append("storage ndim")
    saved_class, cls = meta.get("sampler_class"), type(rb.sampler)
    if saved_class is not None and saved_class != _class_name(cls):
        name = cls.__qualname__
        short = str(saved_class).rsplit(".", 1)[-1]
        theirs, mine = (short, name) if short != name else (saved_class, _class_name(cls))
        problems.append(f"the saved buffer was sampled by {theirs}, this one uses {mine}")
        alike.append("sampler")
    else:  # the arguments and entries any sampler of this class has (their values: _inconsistency)
        problem = Sampler._state_problem(rb.sampler, meta["sampler"])
        if problem is not None:
            problems.append(problem)
            saved, mine = meta["sampler"].get("params"), rb.sampler._params()
            alike.append("sampler" if saved is None or saved.keys() != mine.keys() else "sampler arguments")
    st = rb.storage
    if st.built and not layout:
        problems.append("the saved buffer was saved before its first write, this one already stores frames")
    elif st.built:
        stored = {k: (shape, dtype) for k, shape, dtype in st.layout}
        theirs = {k: (shape, dtype) for k, shape, dtype in layout}
        diff = sorted(str(k) for k in set(stored) ^ set(theirs)) or sorted(
            str(k) for k in stored if stored[k] != theirs[k]
        )
        if diff:
            problems.append(f"the saved buffer's entries {diff} differ (keys, frame shapes or dtypes) from this one's")
        elif st.ndim == 2 and meta["row_length"] != st.row_length:
            problems.append(f"the saved buffer has rows of {meta['row_length']!r} steps, this one {st.row_length}")
    return problems, alike


def _inconsistency(rb: Buffer, meta: dict[str, Any], layout: Layout) -> str | None:
    """What in ``meta`` cannot be restored whatever the buffer (a damaged state), or None."""
    cap, row = meta["capacity"], meta["row_length"]
    if layout:
        if meta["ndim"] == 2 and not (isinstance(row, int) and 1 <= row <= cap):
            return f"row_length {row!r} does not fit capacity {cap!r}"
        expected = cap - cap % row if meta["ndim"] == 2 else cap
    else:
        expected = 0
    if meta["storage_capacity"] != expected:
        return f"storage_capacity {meta['storage_capacity']!r} does not match capacity {cap!r}"
    valid = meta["valid"]
    if not isinstance(valid, torch.Tensor) or valid.dtype != torch.bool or tuple(valid.shape) != (expected,):
        return f"'valid' is not a bool tensor [{expected}]"
    counters = [meta[k] for k in ("cursor", "size", "written", "sampled", "policy_version", "stale_dropped")]
    if not all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in counters):
        return "a counter is not an int >= 0"
    if not meta["cursor"] <= meta["size"] <= expected:
        return f"cursor {meta['cursor']} and size {meta['size']} do not fit {expected} rows"
    if meta["sampler"].get("capacity") != (expected or None):
        return f"the sampler's capacity {meta['sampler'].get('capacity')!r} is not the storage's {expected}"
    problem = rb.sampler._state_problem(meta["sampler"])  # e.g. a tensor of the wrong shape
    if problem is not None:
        return problem
    try:
        torch.Generator().set_state(meta["generator"])
    except (RuntimeError, TypeError) as exc:
        return f"the generator state cannot be restored ({exc})"
    return None


def _check(rb: Buffer, meta: Any, fix: str) -> Layout:
    """Raise one ``ValueError`` naming every way ``meta`` does not fit ``rb``; change nothing."""
    if not isinstance(meta, dict):
        raise TypeError(f"a saved buffer state must be a dict, got {type(meta).__name__}; {fix}")
    if "format" in meta and meta["format"] != _FORMAT:
        raise ValueError(
            f"unsupported buffer state format {meta.get('format')!r} (this aiocollect reads format {_FORMAT}); "
            "load it with the aiocollect version that saved it"
        )
    missing = [k for k in _ENTRIES if k not in meta]
    if missing or not isinstance(meta["sampler"], dict):
        raise ValueError(f"the saved buffer state lacks entries {missing or ['sampler']}; {fix}")
    layout = _layout(meta, fix)
    problems, alike = _mismatches(rb, meta, layout)
    if problems:
        fixes = []
        if alike:
            fixes.append(f"create the buffer with the same {' and '.join(dict.fromkeys(alike))} as the saved one")
        if len(alike) < len(problems):  # the layout differs from what this buffer already stores
            fixes.append("load into a buffer that has not stored anything yet")
        raise ValueError(f"{'; '.join(problems)}; {' and '.join(fixes)}")
    damage = _inconsistency(rb, meta, layout)
    if damage is not None:
        raise ValueError(f"the saved buffer state is damaged: {damage}; {fix}")
    return layout


def _restore(rb: Buffer, meta: dict[str, Any], layout: Layout, frames: dict[Any, torch.Tensor] | None) -> None:
    """Apply a state that `_check` accepted; ``frames=None``: the storage already holds them."""
    if layout:
        rb.build(layout, meta["row_length"] or 1)
        for k, t in rb.storage.tensors.items():
            if frames is not None:
                t.copy_(frames[k])
        rb.storage.sync_host(torch.arange(rb.storage.capacity))
        rb._valid = meta["valid"].clone()
    rb._num_valid = int(rb._valid.sum())
    rb._cursor, rb._size = int(meta["cursor"]), int(meta["size"])
    rb._written, rb._sampled = int(meta["written"]), int(meta["sampled"])
    rb._policy_version, rb._stale_dropped = int(meta["policy_version"]), int(meta["stale_dropped"])
    rb.sampler.load_state_dict(meta["sampler"])
    rb._generator.set_state(meta["generator"])


def _check_idle(rb: Buffer, what: str) -> None:
    if rb._in_flight:
        raise RuntimeError(f"{what} while {rb._in_flight} frames are being written; pause the collectors first")


def state_dict(rb: Buffer) -> dict[str, Any]:
    with rb._lock:
        _check_idle(rb, "state_dict() called")
        state = _meta(rb)
        state["frames"] = {k: t.clone() for k, t in rb.storage.tensors.items()}
        return state


def _check_frames(frames: Any, layout: Layout, rows: int) -> None:
    want = {k: ((rows, *shape), dtype) for k, shape, dtype in layout}
    got = frames if isinstance(frames, dict) else {}
    have = {k: (tuple(t.shape), t.dtype) for k, t in got.items() if isinstance(t, torch.Tensor)}
    if have != want:
        diff = sorted(str(k) for k in set(want) | set(have) if want.get(k) != have.get(k)) or ["frames"]
        raise ValueError(
            f"the saved buffer state is damaged: its frames {diff} do not match its layout; {_FROM_STATE_DICT}"
        )


def load_state_dict(rb: Buffer, state: dict[str, Any]) -> None:
    with rb._lock:
        _check_idle(rb, "load_state_dict() called")
        layout = _check(rb, state, _FROM_STATE_DICT)
        frames = state.get("frames")
        _check_frames(frames, layout, state["storage_capacity"])
        _restore(rb, state, layout, frames)


def dumps(rb: Buffer, path: str) -> None:
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


def _check_files(folder: str, layout: Layout, rows: int) -> None:
    """Refuse (before mapping, which would create or grow them) missing or short frame files."""
    bad = []
    for i, (key, shape, dtype) in enumerate(layout):
        file = os.path.join(folder, _file_name(i, key))
        need = rows * math.prod(shape) * dtype.itemsize
        if need and (not os.path.isfile(file) or os.path.getsize(file) < need):
            bad.append(os.path.basename(file))
    if bad:
        raise ValueError(f"the saved buffer's frame files {bad} are missing or short in {folder!r}; {_FROM_DUMPS}")


def loads(rb: Buffer, path: str) -> None:
    file = os.path.join(path, "state.pt")
    if not os.path.exists(file):
        raise FileNotFoundError(
            f"no saved buffer in {path!r} (state.pt is missing); pass a directory written by dumps()"
        )
    meta = torch.load(file, weights_only=True)
    folder = os.path.join(path, "frames")
    with rb._lock:
        _check_idle(rb, "loads() called")
        layout = _check(rb, meta, _FROM_DUMPS)
        rows = meta["storage_capacity"]
        _check_files(folder, layout, rows)
        frames = None  # a memmap storage in ``folder`` maps the saved files themselves
        if layout and os.path.realpath(getattr(rb.storage, "path", "") or "") != os.path.realpath(folder):
            frames = map_files(folder, [(k, (rows, *shape), dtype) for k, shape, dtype in layout])
        _restore(rb, meta, layout, frames)


class BufferPersistence:
    """The persistence methods of `ReplayBuffer` (a mixin, so the buffer module stays small)."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume: frames, validity, counters, sampler and RNG state."""
        return state_dict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a `state_dict`; nothing changes if it does not fit.

        Args:
            state: A dict returned by `state_dict` of a buffer created with the same capacity,
                storage ndim and sampler (class and arguments).

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: ``state`` does not fit this buffer (the message names every
                difference) or is damaged; the buffer is left unchanged.
            RuntimeError: Frames are being written.
        """
        load_state_dict(self, state)
        self._notifier.notify_all()  # type: ignore[attr-defined]

    def dumps(self, path: str) -> None:
        """Write the buffer (frames as memory-mapped files, plus its state) to directory ``path``."""
        dumps(self, path)

    def loads(self, path: str) -> None:
        """Restore a buffer written by `dumps` (the frame files are mapped, then copied in).

        Args:
            path: The directory `dumps` wrote.

        Raises:
            FileNotFoundError: ``path`` holds no ``state.pt``.
            ValueError: As `load_state_dict`, or frame files are missing or short; the
                buffer is left unchanged (its storage is not built).
        """
        loads(self, path)
        self._notifier.notify_all()  # type: ignore[attr-defined]
