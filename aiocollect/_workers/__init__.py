"""Worker transports, loaded lazily by name (anyio's event-loop backends are the model).

Each transport is one module here, ending with ``transport_class = ...``; the engine finds it
with `get_transport` and never branches on its name.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._transport import Transport

__all__ = ["TRANSPORTS", "get_transport"]

TRANSPORTS = ("inline", "subprocess", "distributed", "ray", "rpc")


def get_transport(name: object) -> type[Transport]:
    """Return the transport class registered as ``name``.

    Raises:
        LookupError: ``name`` is not a known transport, or its module cannot be used here.
    """
    if not isinstance(name, str) or name not in TRANSPORTS:
        raise LookupError(f"unknown worker backend {name!r}; choose one of: {', '.join(sorted(TRANSPORTS))}")
    try:
        module = importlib.import_module(f"{__name__}._{name}")
    except ImportError as exc:
        raise LookupError(f"worker backend {name!r} is not available: {exc}") from exc
    return module.transport_class
