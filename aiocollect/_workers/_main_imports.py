"""What a worker imports again when it re-imports the main script, so that the fork server can import it once.

A worker started by the fork server (or spawned) first re-imports the script that started
its parent (multiprocessing runs it as ``__mp_main__``, to find the functions and classes the
worker unpickles), so that script's top-level imports run again in every worker. A script
that begins as TorchRL's examples do (``from aiocollect import MultiSyncDataCollector``,
``from tensordict.nn import TensorDictModule``) made every worker import tensordict, which
imports ``torch._dynamo``: about 1.5 s of CPU and 80 MB of private memory per worker, before
its first step. Preloaded by the fork server instead, it is imported once and every worker
shares it.

The script is read, never run: its source is parsed and the imports at its top level, outside
``if __name__ == "__main__":`` and outside functions, are what a worker's re-import runs.
Of those, only modules of `PRELOADABLE` packages are taken, and of those only what cannot
make the server's import fail (`_preloadable`): these packages start no thread or CUDA context
at import, which a process that forks must not have. Any other import (an env library, the
user's own modules) stays in each worker, as before.

This module imports nothing heavy: it runs before tensordict is imported.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator, Sequence

__all__ = ["PRELOADABLE", "main_imports"]

#: Packages the fork server may import on a script's behalf.
PRELOADABLE = ("aiocollect", "tensordict", "torchrl")
_TRY = (ast.Try, getattr(ast, "TryStar", ast.Try))  # try/except* (3.11) has try's fields


def main_imports() -> list[str]:
    """The `PRELOADABLE` modules that a worker imports when it re-imports the main script.

    Empty when workers do not re-import it (an interactive session, ``python -c``, ``python
    -m package``) or when it cannot be read or parsed: then each worker imports what it needs
    itself, as it would anyway.
    """
    path = _reimported_main()
    if path is None:
        return []
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return []
    names: list[str] = []
    for node in _top_level(tree.body):
        names.extend(_modules(node))
    return [n for n in dict.fromkeys(names) if _preloadable(n)]


def _reimported_main() -> str | None:
    """The file a worker re-imports as ``__mp_main__``, by multiprocessing's rules (``spawn.prepare``)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if not isinstance(path, str):
        return None
    name = getattr(getattr(main, "__spec__", None), "name", None)
    if name is not None:  # python -m: re-imported by name, unless it is a package's __main__
        return None if name == "__main__" or name.endswith(".__main__") else path
    if os.path.splitext(os.path.basename(path))[0] == "ipython":
        return None
    return path


def _top_level(body: Sequence[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements a module's import runs: not those in functions, classes or the main guard."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If):
            if not _is_main_guard(node.test):
                yield from _top_level(node.body)
            yield from _top_level(node.orelse)
        elif isinstance(node, _TRY):
            yield from _top_level(node.body)
            for handler in node.handlers:
                yield from _top_level(handler.body)
            yield from _top_level(node.orelse)
            yield from _top_level(node.finalbody)
        elif isinstance(node, ast.With):
            yield from _top_level(node.body)


def _is_main_guard(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, test.comparators[0]]
    return any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides) and any(
        isinstance(s, ast.Constant) and s.value == "__main__" for s in sides
    )


def _modules(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level or node.module is None:
        return []  # a relative import: the script's own package
    if node.module != "aiocollect":
        return [node.module]
    # aiocollect's public names are imported on first use (PEP 562): what a worker imports is
    # the module behind each name, not the light package.
    from .._core._names import LAZY

    names = [alias.name for alias in node.names]
    modules = {m for m, _ in LAZY.values()} if "*" in names else {LAZY[n][0] for n in names if n in LAZY}
    return ["aiocollect", *(f"aiocollect{m}" for m in sorted(modules))]


def _preloadable(name: str) -> bool:
    """Whether the fork server may import ``name``: an import that raises anything but ImportError
    would kill it (multiprocessing's preload tolerates only that), say one a script guards with
    ``try``/``except Exception``. So only what the parent has already imported is taken, and
    aiocollect's own modules and tensordict (its dependency), which the parent is importing
    when a collector's lookup starts the server."""
    return name.partition(".")[0] in PRELOADABLE and (
        name in sys.modules or name == "tensordict" or name.startswith("aiocollect")
    )
