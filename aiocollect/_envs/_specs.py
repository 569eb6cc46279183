"""Specs: what an environment's observations and actions look like, per env and unbatched."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch

__all__ = ["ArraySpec", "EnvSpec", "NestedKey"]

NestedKey = str | tuple[str, ...]
Kind = Literal["box", "discrete", "one_hot", "multi_discrete", "binary"]


def _key_str(key: NestedKey) -> str:
    return key if isinstance(key, str) else ".".join(key)


@dataclass(frozen=True, eq=False)
class ArraySpec:
    """The shape, dtype and range of one tensor entry of a single (unbatched) environment.

    Args:
        shape: Shape of the entry for one environment.
        dtype: Torch dtype of the entry.
        kind: ``"box"`` (continuous or integer range), ``"discrete"`` (an int64 index
            in ``[0, n)``), ``"one_hot"`` (a one-hot vector of length ``n``),
            ``"multi_discrete"`` (one index per ``nvec`` entry) or ``"binary"`` (0/1).
        low: Lower bound for ``"box"`` entries (broadcastable to ``shape``), or ``None``.
        high: Upper bound for ``"box"`` entries, or ``None``.
        n: Number of categories for ``"discrete"`` and ``"one_hot"``.
        nvec: Number of categories per position for ``"multi_discrete"``.

    Examples:
        >>> import torch
        >>> spec = ArraySpec((2,), torch.float32, low=-1.0, high=1.0)
        >>> a = spec.sample(torch.Generator().manual_seed(0), (3,))
        >>> a.shape, bool(((a >= -1) & (a <= 1)).all())
        (torch.Size([3, 2]), True)
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    kind: Kind = "box"
    low: torch.Tensor | float | None = None
    high: torch.Tensor | float | None = None
    n: int | None = None
    nvec: torch.Tensor | None = field(default=None)

    def zeros(self, batch_shape: tuple[int, ...] = (), device: torch.device | str | None = None) -> torch.Tensor:
        """Return a zero tensor of shape ``(*batch_shape, *shape)``."""
        return torch.zeros((*batch_shape, *self.shape), dtype=self.dtype, device=device)

    def sample(self, generator: torch.Generator, batch_shape: tuple[int, ...] = ()) -> torch.Tensor:
        """Draw a uniformly random valid value for each env in ``batch_shape``.

        Args:
            generator: The CPU generator that makes the draw reproducible.
            batch_shape: Leading batch dimensions.

        Returns:
            A CPU tensor of shape ``(*batch_shape, *shape)`` and this spec's dtype.
        """
        full = (*batch_shape, *self.shape)
        if self.kind == "discrete":
            assert self.n is not None, "a discrete spec has n"
            return torch.randint(int(self.n), full, generator=generator, dtype=torch.int64).to(self.dtype)
        if self.kind == "one_hot":
            assert self.n is not None, "a one_hot spec has n"
            idx = torch.randint(int(self.n), full[:-1], generator=generator)
            return torch.nn.functional.one_hot(idx, int(self.n)).to(self.dtype)
        if self.kind == "multi_discrete":
            assert self.nvec is not None, "a multi_discrete spec has nvec"
            u = torch.rand(full, generator=generator, dtype=torch.float64)
            return (u * self.nvec.to(torch.float64)).floor().to(self.dtype)
        if self.kind == "binary":
            return torch.randint(2, full, generator=generator).to(self.dtype)
        low, high = self._bounds()
        if self.dtype.is_floating_point:
            u = torch.rand(full, generator=generator, dtype=torch.float64)
            lo = torch.where(torch.isfinite(low), low, -1.0)
            hi = torch.where(torch.isfinite(high), high, 1.0)
            out = lo + u * (hi - lo)
            # Half-open boxes get low + Exp(1) or high - Exp(1), open ones a standard normal
            # (gymnasium's rule), so every draw is inside the box.
            lo_ok, hi_ok = torch.isfinite(low), torch.isfinite(high)
            if not bool((lo_ok & hi_ok).all()):
                normal = torch.randn(full, generator=generator, dtype=torch.float64)
                expo = -torch.log1p(-torch.rand(full, generator=generator, dtype=torch.float64))
                out = torch.where(lo_ok & ~hi_ok, low + expo, out)
                out = torch.where(~lo_ok & hi_ok, high - expo, out)
                out = torch.where(~lo_ok & ~hi_ok, normal, out)
            return out.to(self.dtype)
        u = torch.rand(full, generator=generator, dtype=torch.float64)
        return (low + (u * (high - low + 1)).floor()).clamp(max=high).to(self.dtype)

    def _bounds(self) -> tuple[torch.Tensor, torch.Tensor]:
        def as_t(v: object, default: float) -> torch.Tensor:
            t = torch.as_tensor(default if v is None else v, dtype=torch.float64)
            return t.expand(self.shape) if t.shape != self.shape else t

        return as_t(self.low, -math.inf), as_t(self.high, math.inf)

    def check(self, name: NestedKey, value: torch.Tensor, batch_shape: tuple[int, ...]) -> None:
        """Raise ``PolicyOutputError`` if ``value`` does not have this spec's shape and dtype."""
        from .._core._errors import PolicyOutputError

        want = (*batch_shape, *self.shape)
        if not isinstance(value, torch.Tensor):
            raise PolicyOutputError(
                f"policy output {_key_str(name)!r} must be a torch.Tensor of shape {want} and dtype "
                f"{self.dtype}, got {type(value).__name__}; make the policy return a tensor"
            )
        if tuple(value.shape) != want:
            raise PolicyOutputError(
                f"policy output {_key_str(name)!r} must have shape {want} (batch {batch_shape} + "
                f"action {self.shape}), got {tuple(value.shape)}; fix the policy's output layer"
            )
        ok_dtype = value.dtype == self.dtype or (
            value.dtype.is_floating_point == self.dtype.is_floating_point and value.dtype != torch.bool
        )
        if not ok_dtype:
            raise PolicyOutputError(
                f"policy output {_key_str(name)!r} must have dtype {self.dtype}, got {value.dtype}; "
                f"cast the action (e.g. .to({self.dtype}))"
            )


@dataclass(frozen=True, eq=False)
class EnvSpec:
    """The full description of a batched environment.

    Args:
        batch_size: The env batch shape, ``()`` for a single env, ``(n,)`` for a vector of n.
        observation: Map from (possibly nested) observation key to its per-env spec.
        action: Map from action key (usually ``"action"``) to its per-env spec.
        next_only: Entries a step returns but a reset does not (a multi-agent env's per-agent
            rewards): recorded under ``"next"`` only, never shown to the policy. A step's
            observation dict carries them beside the observations.
        root_reward: Whether batches hold ``("next", "reward")``. An env whose rewards are
            all ``next_only`` entries (one per agent group) has none at the root; the
            collector's own done flags still aggregate the env's.

    Examples:
        >>> import torch
        >>> spec = EnvSpec(
        ...     torch.Size([4]),
        ...     observation={"observation": ArraySpec((3,), torch.float32)},
        ...     action={"action": ArraySpec((), torch.int64, kind="discrete", n=2)},
        ... )
        >>> spec.numel
        4
    """

    batch_size: torch.Size
    observation: dict[NestedKey, ArraySpec]
    action: dict[NestedKey, ArraySpec]
    next_only: dict[NestedKey, ArraySpec] = field(default_factory=dict)
    root_reward: bool = True

    @property
    def numel(self) -> int:
        """Number of environments in the batch."""
        return math.prod(self.batch_size)
