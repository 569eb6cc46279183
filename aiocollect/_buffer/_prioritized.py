"""Prioritized replay: a sampler over sum and min trees of per-frame priorities."""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from .._core._errors import BufferEmptyError
from ._samplers import _EMPTY, _FLOAT, _INT, _POS, SampleContext, Sampler, _Batch, _check

__all__ = ("PrioritizedSampler",)


class PrioritizedSampler(Sampler):
    """Proportional prioritized replay (Schaul et al. 2016) over a sum tree and a min tree.

    Frame ``i`` is drawn with probability ``p_i / sum(p)``, ``p_i = (priority + eps) ** alpha``;
    new frames get ``max_priority ** alpha``, ``max_priority`` being the largest ``priority +
    eps`` yet. Draws are stratified (one per ``1/batch_size`` of the mass, so in index order),
    cost O(batch_size * log capacity) and see frames extended and not invalidated since, not
    ``ctx.valid``. Info: float32 importance weights ``"_weight"`` = ``(p_i / min(p)) ** -beta``.

    Args:
        alpha: Priority exponent; 0 gives uniform sampling.
        beta: Importance-weight exponent; the ``beta`` attribute may be reassigned (annealed).
        eps: Added to each priority so that no updated frame becomes unreachable.
        max_priority: Initial priority of new frames, before ``alpha``.

    Raises:
        TypeError: An argument is not a real number.
        ValueError: An argument is negative or not finite, or ``max_priority`` is 0.

    Examples:
        >>> sampler = PrioritizedSampler(alpha=1.0, beta=1.0)
        >>> sampler.reset(4)
        >>> sampler.extend(torch.arange(4))
        >>> sampler.update_priority(torch.tensor([1]), 3.0)
        >>> ctx = SampleContext(torch.ones(4, dtype=torch.bool), 4, 4, None, None, None)
        >>> sampler.sample(ctx, 6, torch.Generator().manual_seed(0))[1]["_weight"]
        tensor([1.0000, 0.3333, 0.3333, 0.3333, 1.0000, 1.0000])
    """

    _state_keys = frozenset({"priorities", "max_priority"})

    def __init__(self, alpha: float, beta: float, eps: float = 1e-8, max_priority: float = 1.0):
        self.alpha, self.beta = _check("alpha", alpha, _FLOAT), _check("beta", beta, _FLOAT)
        self.eps = _check("eps", eps, _FLOAT)
        self.max_priority = self._initial_max = _check("max_priority", max_priority, _POS)

    def _params(self) -> dict[str, Any]:
        # Not beta: it may be annealed, so the loading program sets its own.
        return {"alpha": self.alpha, "eps": self.eps, "max_priority": self._initial_max}

    def reset(self, capacity: int) -> None:
        """Forget all priorities and size the trees; see `Sampler.reset`."""
        super().reset(capacity)
        # Power-of-two leaves put every leaf at the same depth, so descents vectorize.
        self._leaf0 = 1 << (capacity - 1).bit_length()
        self._sum, self._min = np.zeros(2 * self._leaf0), np.full(2 * self._leaf0, np.inf)
        self.max_priority = self._initial_max

    def _set(self, leaves: np.ndarray, values: np.ndarray | float) -> None:
        pos = leaves + self._leaf0
        self._sum[pos] = values
        # Zero-priority frames cannot be drawn, so they must not set the weights' minimum.
        self._min[pos] = np.where(self._sum[pos] > 0, self._sum[pos], np.inf)
        if pos.size > 1 and pos[-1] - pos[0] == pos.size - 1 and pos[1] > pos[0]:
            # A contiguous run (what a buffer write commits): each level is one slice update.
            lo, hi, total, low = int(pos[0]), int(pos[-1]), self._sum, self._min
            while lo > 1:
                lo, hi = lo >> 1, hi >> 1
                left, right, parents = slice(2 * lo, 2 * hi + 2, 2), slice(2 * lo + 1, 2 * hi + 2, 2), slice(lo, hi + 1)
                np.add(total[left], total[right], out=total[parents])
                np.minimum(low[left], low[right], out=low[parents])
            return
        big = pos.size * self._leaf0.bit_length() > self._leaf0  # then updating all is cheaper
        pos = np.arange(self._leaf0, 2 * self._leaf0) if big else np.unique(pos)
        while pos.size and pos[0] > 1:
            pos >>= 1
            pos = pos[np.r_[True, pos[1:] != pos[:-1]]]  # sorted, so drop sibling repeats
            self._sum[pos] = self._sum[2 * pos] + self._sum[2 * pos + 1]
            self._min[pos] = np.minimum(self._min[2 * pos], self._min[2 * pos + 1])

    def extend(self, index: torch.Tensor) -> None:
        """Give the new frames the current maximum priority; see `Sampler.extend`."""
        self._set(np.asarray(index, dtype=np.int64).reshape(-1), self.max_priority**self.alpha)

    def invalidate(self, index: torch.Tensor) -> None:
        """Set these frames' priority to 0; see `Sampler.invalidate`."""
        self._set(np.asarray(index, dtype=np.int64).reshape(-1), 0.0)

    def update_priority(self, index: torch.Tensor, priority: torch.Tensor | float) -> None:
        """Store ``(priority + eps) ** alpha`` for the frames at ``index``.

        Frames whose priority is 0, as after `invalidate`, are skipped: a late update must not
        revive a frame invalidated since it was sampled. If an index repeats, the last wins.

        Args:
            index: int64 frame indices, as returned by `sample`.
            priority: One priority >= 0 per index (e.g. absolute TD errors), or one for all.

        Raises:
            ValueError: Lengths differ, a priority is < 0 or not finite, or an index out of range.
        """
        idx = np.asarray(index, dtype=np.int64).reshape(-1)
        prio = torch.as_tensor(priority).detach().to("cpu", torch.float64).reshape(-1).numpy()
        prio = np.broadcast_to(prio, idx.shape) if prio.size == 1 else prio
        if (n := idx.size) != (m := prio.size):
            raise ValueError(f"index and priority must have the same length, got {n} and {m}")
        if (bad := ~(np.isfinite(prio) & (prio >= 0))).any():
            raise ValueError(f"priority must be finite and >= 0, got {prio[bad][0]}")
        cap = self._built_capacity()
        if (bad := (idx < 0) | (idx >= cap)).any():
            raise ValueError(f"index must be in [0, {cap}), got {idx[bad][0]}")
        # numpy leaves repeated assignment unspecified: keep each index's last occurrence.
        uniq, first_reversed = np.unique(idx[::-1], return_index=True)
        raw = prio[idx.size - 1 - first_reversed] + self.eps
        if (keep := self._sum[uniq + self._leaf0] > 0).any():
            self.max_priority = max(self.max_priority, float(raw[keep].max()))
            self._set(uniq[keep], raw[keep] ** self.alpha)

    def _descend(self, mass: np.ndarray, guard: bool) -> np.ndarray:
        node = np.ones(mass.size, dtype=np.int64)
        while node[0] < self._leaf0:
            node <<= 1
            left = self._sum[node]
            right = mass >= left
            if guard:  # rounding can overshoot into an empty right subtree: never enter one
                right &= self._sum[node + 1] > 0
            mass = mass - left * right
            node += right
        return node

    def sample(self, ctx: SampleContext, batch_size: int, generator: torch.Generator) -> _Batch:
        """Draw frames in proportion to priority, with ``"_weight"`` info; see `Sampler.sample`.

        Raises:
            BufferEmptyError: No frame is valid (has a priority > 0).
        """
        n = _check("batch_size", batch_size, _INT)
        if ctx.num_valid <= 0 or not self._sum[1] > 0:
            raise BufferEmptyError(_EMPTY)
        u = torch.rand(n, generator=generator, dtype=torch.float64).numpy()
        mass = (np.arange(n) + u) * (self._sum[1] / n)
        node = self._descend(mass, guard=False)
        if (bad := self._sum[node] == 0).any():  # a rounding overshoot: very rare
            node[bad] = self._descend(mass[bad], guard=True)
        weight = ((self._sum[node] / self._min[1]) ** -self.beta).astype(np.float32)
        return torch.from_numpy(node - self._leaf0), {"_weight": torch.from_numpy(weight)}

    def _state(self) -> dict[str, Any]:  # the tree leaves; inner nodes are rebuilt on load
        leaves = torch.from_numpy(self._sum[self._leaf0 : self._leaf0 + self._built_capacity()].copy())
        return {"priorities": leaves, "max_priority": self.max_priority}

    def _load(self, state: Mapping[str, Any]) -> None:
        self._set(np.arange(self._built_capacity()), torch.as_tensor(state["priorities"]).double().numpy())
        self.max_priority = float(state["max_priority"])

    def _state_problem(self, state: Any) -> str | None:
        problem = super()._state_problem(state)
        if problem is not None or not state["capacity"]:
            return problem
        cap, prio, top = state["capacity"], state["priorities"], state["max_priority"]
        if not isinstance(prio, torch.Tensor) or prio.dim() != 1 or prio.numel() != cap:
            return f"the saved priorities must be a 1-D tensor of {cap} values, got {prio!r}"
        if not bool((torch.isfinite(prio) & (prio >= 0)).all()):
            return "the saved priorities must be finite and >= 0"
        if isinstance(top, bool) or not isinstance(top, numbers.Real) or not 0 < float(top) < float("inf"):
            return f"the saved max_priority must be a finite float > 0, got {top!r}"
        return None
