"""A griffe extension for the API reference: class docstrings completed at import time.

The collectors share their ``Args:`` section through a ``{args}`` placeholder that the module
fills in when it is imported; static analysis sees the placeholder, so take the docstring of
the imported class instead.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import griffe


class RuntimeDocstrings(griffe.Extension):
    """Replace a class docstring holding ``{args}`` with the imported class's ``__doc__``."""

    def on_class_members(self, *, cls: griffe.Class, **kwargs: Any) -> None:
        if cls.docstring is None or "{args}" not in cls.docstring.value:
            return
        runtime = getattr(importlib.import_module(cls.module.path), cls.name)
        cls.docstring.value = inspect.cleandoc(runtime.__doc__)
