"""Public paths and docstrings: what ``help()``, reprs and tracebacks show of a public class.

Both are fixed up at import time, in ways that must hold on every supported Python: 3.13's
compiler strips the common indentation of docstrings (so a template filled by plain text
replacement comes out mis-indented there), and 3.13's ``pydoc`` names the module of each
inherited method (so renaming the class's module alone leaves the private path in ``help()``).
"""

from __future__ import annotations

import re
import sys
import textwrap
from typing import Any

from ._names import LAZY

__all__ = ["fill_args", "publish", "publish_loaded"]


def publish(obj: Any, module: str = "aiocollect") -> None:
    """Give ``obj`` (and, for a class, the functions defined in its body) the public ``module``.

    trio's trick: reprs, tracebacks, pickles and ``help()`` name the public path, not the
    private module the object is defined in. Only what still names an ``aiocollect._``
    module is renamed; an object that refuses a new ``__module__`` keeps its own.
    """
    old = getattr(obj, "__module__", None)
    if not (isinstance(old, str) and old.startswith("aiocollect._")):
        return
    try:
        obj.__module__ = module
    except (AttributeError, TypeError):
        return
    if isinstance(obj, type):
        for value in vars(obj).values():
            for fn in (value, getattr(value, "__func__", None), getattr(value, "fget", None)):
                if callable(fn) and getattr(fn, "__module__", None) == old:
                    try:
                        fn.__module__ = module
                    except (AttributeError, TypeError):
                        pass


def publish_loaded(package: str = "aiocollect") -> None:
    """`publish` every public name whose private module is imported already.

    The package imports its names on first use, so a public class can be loaded long before
    its own first lookup: as another's base (``Collector`` under ``AsyncBatchedCollector``),
    or by the package's own code (``WorkerError``). Publishing at each lookup, and at the
    import of `aiocollect.blocking`, makes what ``help()``, reprs and tracebacks show
    independent of which name a user happened to look up first.
    """
    for module, attr in LAZY.values():
        loaded = sys.modules.get(package + module)
        if loaded is not None and hasattr(loaded, attr):
            publish(getattr(loaded, attr), package)


def fill_args(cls: type, entries: str) -> None:
    """Replace the ``{args}`` line of ``cls``'s docstring with ``entries``, indented like that line.

    ``entries`` is dedented first, so it may be written at any indentation.
    """
    doc = cls.__doc__ or ""
    line = re.search(r"^( *)\{args\}$", doc, re.MULTILINE)
    if line is None:
        raise RuntimeError(f"the docstring of {cls.__qualname__} must hold an {{args}} line")
    text = textwrap.indent(textwrap.dedent(entries).rstrip("\n"), line.group(1))
    cls.__doc__ = doc[: line.start()] + text + doc[line.end() :]
