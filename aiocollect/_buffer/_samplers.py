"""Replay-buffer index samplers: pure, synchronous choices over ``capacity`` frame indices.

`PrioritizedSampler` lives in ``_prioritized.py`` and `SliceSampler` in ``_slices.py``.
"""

from __future__ import annotations

import math
import numbers
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from .._core._errors import BufferEmptyError

__all__ = (
    "RandomSampler",
    "SampleContext",
    "Sampler",
    "SamplerWithoutReplacement",
    "make_sampler",
)

_Batch = tuple[torch.Tensor, dict[Any, torch.Tensor]]  # indices, per-item extras (str or nested keys)
_EMPTY = "sample() called on an empty buffer; await buffer.wait_for(n) first"
# Rejection rounds before an exact O(size) fallback; few frames are ever reserved at once.
_ROUNDS = 8
_BOOL, _INT, _FLOAT, _POS = "a bool", "an int >= 1", "a finite float >= 0", "a finite float > 0"


def _check(name: str, value: Any, rule: str) -> Any:
    kind = bool if rule == _BOOL else numbers.Integral if rule == _INT else numbers.Real
    # Checked into a flag rather than narrowed: typeshed's numbers.Real has no __int__.
    right_kind = isinstance(value, kind) and (kind is bool or not isinstance(value, bool))
    if not right_kind:
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    if kind is bool:
        return value
    number = float(value)
    if not (1 if rule == _INT else 0) <= number < math.inf or (rule == _POS and number == 0):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return int(value) if rule == _INT else number


@dataclass(frozen=True)
class SampleContext:
    """What the buffer tells a sampler at sample time (read-only).

    Attributes:
        valid: bool ``[capacity]``, True where a committed frame may be sampled.
        num_valid: ``int(valid.sum())``, precomputed by the buffer.
        size: Frames ever written, capped at capacity; ``valid`` is False at ``>= size``.
        traj_ids: int64 ``[capacity]`` ``("collector", "traj_ids")`` of each frame, or None.
        worker_ids: int64 ``[capacity]`` ``("collector", "worker_id")`` of each frame, or None.
        row_length: Frames per row of 2-D storage (a slice must stay in one row), else None.

    Examples:
        >>> SampleContext(torch.tensor([True, True, False]), 2, 3, None, None, None).size
        3
    """

    valid: torch.Tensor
    num_valid: int
    size: int
    traj_ids: torch.Tensor | None
    worker_ids: torch.Tensor | None
    row_length: int | None


class Sampler(ABC):
    """Chooses which frames of a replay buffer a ``sample()`` call returns.

    The buffer calls `reset` first, then reports committed frames (`extend`) and frames about
    to be overwritten (`invalidate`). Subclasses implement `sample`, drawing all randomness
    from its generator so that a seeded buffer is reproducible. A subclass with state of its
    own returns it from ``_state()`` and restores it in ``_load(state)``; ``_params()``
    returns the constructor arguments a saved state must match, and ``_state_problem(state)``
    (extended with ``super()``) says what in a state does not fit, for `check_state_dict`.

    Examples:
        >>> class FirstFrames(Sampler):
        ...     def sample(self, ctx, batch_size, generator):
        ...         return torch.arange(batch_size) % ctx.size, {}
        >>> ctx = SampleContext(torch.ones(4, dtype=torch.bool), 4, 4, None, None, None)
        >>> FirstFrames().sample(ctx, 6, torch.Generator())[0]
        tensor([0, 1, 2, 3, 0, 1])
    """

    capacity: int | None = None
    # The entries `_state` adds once reset; None (a custom sampler's default): not checked.
    _state_keys: ClassVar[frozenset[str] | None] = None

    def reset(self, capacity: int) -> None:
        """Forget everything; called once the capacity is known and on buffer reset.

        Args:
            capacity: Number of frames the storage holds, an int >= 1.
        """
        self.capacity = _check("capacity", capacity, _INT)

    def _built_capacity(self) -> int:
        """The capacity `reset` set: the buffer calls the sampler only once its storage is built."""
        if self.capacity is None:
            raise RuntimeError(f"this {type(self).__name__} has no capacity yet: the buffer has stored no frame")
        return self.capacity

    def extend(self, index: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """Note that new data was committed at ``index``.

        Args:
            index: int64 1-D tensor of frame indices.
        """

    def invalidate(self, index: torch.Tensor) -> None:  # noqa: B027 - optional hook
        """Note that these frames are about to be overwritten: never return them until `extend`.

        Args:
            index: int64 1-D tensor of frame indices.
        """

    @abstractmethod
    def sample(self, ctx: SampleContext, batch_size: int, generator: torch.Generator) -> _Batch:
        """Choose frame indices.

        Args:
            ctx: What the buffer currently holds.
            batch_size: Number of indices to return (`SliceSampler` with
                ``strict_length=False`` may return fewer).
            generator: The only source of randomness.

        Returns:
            int64 indices ``[n]`` and a dict of extra ``[n]`` tensors (keys: strings or
            nested tuples), ``n`` being ``batch_size`` unless the sampler documents otherwise.

        Raises:
            BufferEmptyError: Nothing may be sampled.
        """

    def state_dict(self) -> dict[str, Any]:
        """Return everything needed to resume exactly (Python scalars and tensors).

        Returns:
            A dict for `load_state_dict`: ``"capacity"`` (None before `reset`), ``"params"``
            (the constructor arguments, for samplers that take any) and, once reset, the
            sampler's own state.
        """
        params = self._params()
        return {
            "capacity": self.capacity,
            **({"params": params} if params else {}),
            **(self._state() if self.capacity else {}),
        }

    def check_state_dict(self, state: Mapping[str, Any]) -> None:
        """Check, changing nothing, that `load_state_dict` can restore ``state`` exactly.

        A state saved without ``"params"`` (by an older aiocollect) fits if its entries do.

        Args:
            state: A dict from `state_dict`.

        Raises:
            TypeError: ``state`` is not a dict.
            ValueError: ``state`` comes from a sampler of another class or created with other
                arguments, or is malformed.
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"state must be a dict returned by state_dict(), got {type(state).__name__}")
        problem = self._state_problem(state)
        if problem is not None:
            name = type(self).__name__
            raise ValueError(f"{problem}; load a state_dict() of a {name} created with the same arguments")

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the state returned by `state_dict` of the same sampler class.

        Args:
            state: A dict from `state_dict`.

        Raises:
            TypeError: As `check_state_dict`.
            ValueError: As `check_state_dict`; the sampler is left unchanged.
        """
        self.check_state_dict(state)
        if state["capacity"]:  # else it was saved before reset(): there is nothing to restore
            self.reset(state["capacity"])
            self._load(state)

    def _params(self) -> dict[str, Any]:  # constructor arguments a saved state must match
        return {}

    def _state(self) -> dict[str, Any]:  # a subclass's state beyond capacity, once reset()
        return {}

    def _load(self, state: Mapping[str, Any]) -> None: ...  # noqa: B027 - nothing by default

    def _state_problem(self, state: Any) -> str | None:
        """What in ``state`` does not fit this sampler (a clause for an error message), or None."""
        name = type(self).__name__
        if not isinstance(state, Mapping):
            return f"the sampler state must be a dict, got {type(state).__name__}"
        if "capacity" not in state:
            return "the sampler state has no 'capacity' entry"
        cap = state["capacity"]
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, numbers.Integral) or cap < 1):
            return f"the sampler state's capacity must be None or an int >= 1, got {cap!r}"
        saved, mine = state.get("params"), self._params()
        if saved is not None and saved != mine:
            if not isinstance(saved, Mapping) or set(saved) != set(mine):
                what = sorted(saved) if isinstance(saved, Mapping) else repr(saved)
                return f"the saved sampler took arguments {what}, a {name} takes {sorted(mine)}"
            keys = [k for k in mine if saved[k] != mine[k]]
            then = ", ".join(f"{k}={saved[k]!r}" for k in keys)
            return f"the saved {name} had {then}, this one has {', '.join(f'{k}={mine[k]!r}' for k in keys)}"
        if self._state_keys is not None:
            needed = self._state_keys if cap else frozenset()
            extra = sorted(set(state) - {"capacity", "params"} - needed)
            if extra:
                return f"the saved sampler state has entries {extra} that a {name} does not use"
            missing = sorted(needed - set(state))
            if missing:
                return f"the saved sampler state lacks entries {missing} that a {name} needs"
        return None


class RandomSampler(Sampler):
    """Uniform sampling with replacement over the valid frames (TorchRL's `RandomSampler`).

    Invalid draws from ``[0, size)`` are redrawn: O(batch_size) per call. Info is empty.

    Examples:
        >>> ctx = SampleContext(torch.arange(8) < 4, 4, 4, None, None, None)
        >>> index, info = RandomSampler().sample(ctx, 16, torch.Generator().manual_seed(0))
        >>> bool((index < 4).all()), info
        (True, {})
    """

    _state_keys = frozenset()

    def sample(self, ctx: SampleContext, batch_size: int, generator: torch.Generator) -> _Batch:
        """Draw uniformly with replacement; see `Sampler.sample`."""
        n = _check("batch_size", batch_size, _INT)
        if ctx.num_valid <= 0:
            raise BufferEmptyError(_EMPTY)
        if ctx.num_valid == ctx.size:  # [0, size) is all valid
            return torch.randint(ctx.size, (n,), generator=generator), {}
        idx = torch.empty(0, dtype=torch.int64)
        for _ in range(_ROUNDS):  # overdraw a little, so that one round nearly always suffices
            cand = torch.randint(ctx.size, (n + n // 8 + 8,), generator=generator)
            idx = torch.cat([idx, cand[ctx.valid[cand]]])
            if idx.numel() >= n:
                return idx[:n], {}
        pool = ctx.valid[: ctx.size].nonzero().squeeze(1)
        rest = pool[torch.randint(pool.numel(), (n - idx.numel(),), generator=generator)]
        return torch.cat([idx, rest]), {}


class SamplerWithoutReplacement(Sampler):
    """Epochs over the valid frames, each frame returned once per epoch (as in TorchRL).

    An epoch is a permutation of the frames valid when it starts; each call returns its next
    ``batch_size``, skipping frames invalidated or rewritten since (new frames wait for the
    next epoch). Unlike TorchRL, a call always returns exactly ``batch_size`` indices: a short
    remainder is topped up from a new epoch (``drop_last=True``: dropped).

    Args:
        drop_last: Drop an epoch's incomplete last batch instead of topping it up.
        shuffle: Permute each epoch; if false, go in ascending index order.

    Raises:
        TypeError: An argument is not a bool.

    Examples:
        >>> sampler = SamplerWithoutReplacement(shuffle=False)
        >>> sampler.reset(5)
        >>> ctx = SampleContext(torch.ones(5, dtype=torch.bool), 5, 5, None, None, None)
        >>> [sampler.sample(ctx, 2, torch.Generator())[0].tolist() for _ in range(3)]
        [[0, 1], [2, 3], [4, 0]]
    """

    _state_keys = frozenset({"perm", "pos", "stale"})

    def __init__(self, drop_last: bool = False, shuffle: bool = True) -> None:
        self.drop_last = _check("drop_last", drop_last, _BOOL)
        self.shuffle = _check("shuffle", shuffle, _BOOL)

    def _params(self) -> dict[str, Any]:
        return {"drop_last": self.drop_last, "shuffle": self.shuffle}

    def reset(self, capacity: int) -> None:
        """Forget the current epoch; see `Sampler.reset`."""
        super().reset(capacity)
        self._perm, self._pos = torch.empty(0, dtype=torch.int64), 0
        self._stale = torch.zeros(capacity, dtype=torch.bool)  # skip for the rest of the epoch

    def invalidate(self, index: torch.Tensor) -> None:
        """Hold these frames back until the next epoch; see `Sampler.invalidate`."""
        self._stale[torch.as_tensor(index, dtype=torch.int64)] = True

    # A frame rewritten mid-epoch holds new data, which belongs to the next epoch.
    extend = invalidate

    def sample(self, ctx: SampleContext, batch_size: int, generator: torch.Generator) -> _Batch:
        """Return the epoch's next frames; see `Sampler.sample`.

        Raises:
            BufferEmptyError: Fewer than 1 (``drop_last=True``: ``batch_size``) valid frames.
        """
        need = _check("batch_size", batch_size, _INT)
        parts: list[torch.Tensor] = []
        while need:
            if self._pos >= self._perm.numel():  # start a new epoch
                self._perm, self._pos = ctx.valid[: ctx.size].nonzero().squeeze(1), 0
                self._stale.zero_()
                if self._perm.numel() == 0:
                    raise BufferEmptyError(_EMPTY)
                if self.shuffle:
                    self._perm = self._perm[torch.randperm(self._perm.numel(), generator=generator)]
                if self.drop_last and (got := self._perm.numel()) < batch_size:
                    why = f"drop_last=True needs at least batch_size={batch_size} valid frames"
                    raise BufferEmptyError(f"{why}, got {got}; collect more or lower batch_size")
                if self.drop_last:
                    parts, need = [], batch_size
            chunk = self._perm[self._pos : self._pos + need]
            self._pos += chunk.numel()
            keep = ctx.valid[chunk] & ~self._stale[chunk]
            parts.append(chunk if bool(keep.all()) else chunk[keep])
            need -= parts[-1].numel()
        return (parts[0] if len(parts) == 1 else torch.cat(parts)), {}

    def _state(self) -> dict[str, Any]:
        return {"perm": self._perm.clone(), "pos": self._pos, "stale": self._stale.clone()}

    def _load(self, state: Mapping[str, Any]) -> None:
        self._perm, self._pos = state["perm"].clone(), int(state["pos"])
        self._stale = state["stale"].clone()

    def _state_problem(self, state: Any) -> str | None:
        problem = super()._state_problem(state)
        if problem is not None or not state["capacity"]:
            return problem
        cap, perm, pos, stale = state["capacity"], state["perm"], state["pos"], state["stale"]
        if not isinstance(perm, torch.Tensor) or perm.dtype != torch.int64 or perm.dim() != 1:
            return f"the saved epoch order ('perm') must be a 1-D int64 tensor, got {perm!r}"
        if perm.numel() and not (0 <= int(perm.min()) and int(perm.max()) < cap):
            return f"the saved epoch order ('perm') must hold indices in [0, {cap})"
        if isinstance(pos, bool) or not isinstance(pos, numbers.Integral) or not 0 <= int(pos) <= perm.numel():
            return f"the saved epoch position ('pos') must be an int in [0, {perm.numel()}], got {pos!r}"
        if not isinstance(stale, torch.Tensor) or stale.dtype != torch.bool or tuple(stale.shape) != (cap,):
            return f"the saved 'stale' mask must be a bool tensor [{cap}], got {stale!r}"
        return None


def make_sampler(spec: Sampler | str | None) -> Sampler:
    """Turn the buffer's ``sampler=`` argument into a `Sampler`.

    Args:
        spec: None or ``"random"``, ``"without_replacement"``, or a `Sampler` (returned).

    Returns:
        The sampler.

    Raises:
        TypeError: ``spec`` is neither None, a str nor a `Sampler`.
        ValueError: ``spec`` is an unknown name.
    """
    if isinstance(spec, Sampler):
        return spec
    if spec is None or (isinstance(spec, str) and spec in ("random", "without_replacement")):
        return SamplerWithoutReplacement() if spec == "without_replacement" else RandomSampler()
    rule = "sampler must be None, 'random', 'without_replacement' or a Sampler instance"
    raise (ValueError if isinstance(spec, str) else TypeError)(f"{rule}, got {spec!r}")
