"""Worker backends, loaded lazily by name (anyio's event-loop backends are the model)."""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["BACKENDS", "get_worker_backend"]

BACKENDS = ("subprocess",)


def get_worker_backend(name: str) -> Any:
    """Return the worker class of backend ``name``.

    Raises:
        LookupError: ``name`` is not a known backend.
    """
    if name not in BACKENDS:
        raise LookupError(f"unknown worker backend {name!r}; choose one of: {', '.join(sorted(BACKENDS))}")
    return importlib.import_module(f"{__name__}._{name}").backend_class
