"""Small array helpers of the rollout engine: nested ``next`` keys, numpy views, mask shapes."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .._envs._specs import NestedKey

__all__ = ["expand_mask", "next_key", "np_views", "numpy_or_none", "numpy_pair"]


def next_key(key: NestedKey) -> tuple[str, ...]:
    """``("next", *key)``: where the rollout records an observation after the step."""
    return ("next", key) if isinstance(key, str) else ("next", *key)


def np_views(tensors: dict[Any, torch.Tensor]) -> dict[Any, np.ndarray]:
    """Numpy views of those of ``tensors`` that have one (on the CPU, of a dtype numpy knows)."""
    views = {}
    for k, v in tensors.items():
        try:
            views[k] = v.numpy()
        except (RuntimeError, TypeError):  # e.g. bfloat16, or on a GPU: written by torch
            pass
    return views


def numpy_or_none(tensors: dict[Any, torch.Tensor]) -> dict[Any, np.ndarray] | None:
    """Numpy views of all of ``tensors``, or ``None`` (the torch path then writes them)."""
    views = np_views(tensors)
    return views if len(views) == len(tensors) else None


def expand_mask(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``mask`` ([*B]) with trailing 1-dims so it broadcasts against ``like`` ([*B, ...])."""
    return mask.reshape((*mask.shape, *([1] * (like.dim() - mask.dim()))))


def numpy_pair(dst: torch.Tensor, src: torch.Tensor) -> tuple[Any, Any]:
    """``(dst, src)`` as numpy views where their dtypes allow (bfloat16 has none), else as tensors."""
    try:
        return dst.numpy(), src.numpy()
    except TypeError:
        return dst, src
