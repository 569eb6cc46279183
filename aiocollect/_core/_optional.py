"""Recognising objects of optional libraries (torchrl) without importing them.

An object of a library's class can exist only once the library was imported, so a process
that never imported it never will because of aiocollect.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["is_instance_of"]


def is_instance_of(obj: Any, module: str, name: str) -> bool:
    """``isinstance(obj, module.name)``, False without importing ``module`` if it was never imported.

    Examples:
        >>> is_instance_of(object(), "torchrl.envs", "EnvBase")
        False
    """
    if module.partition(".")[0] not in sys.modules:
        return False
    return isinstance(obj, getattr(importlib.import_module(module), name))
