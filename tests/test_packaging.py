"""The package imports nothing that ``pip install .`` does not install.

A fresh ``pip install -e .`` crashed with ``No module named 'sniffio'``: anyio 4.16 stopped
depending on it, and the test extra (through trio) hid the gap. Every module imported
anywhere in the package, at module level or inside a function, must be the standard
library's, a declared dependency, or an optional one imported lazily where it is needed.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "aiocollect"

#: Import name -> distribution name, where they differ.
DISTRIBUTION = {"yaml": "pyyaml"}

#: Optional modules: imported only inside functions, when the user asked for what needs them.
OPTIONAL: set[str] = {"submitit", "ray", "torchrl"}  # submitit launcher; Ray; TorchRL envs and buffers


def _declared() -> set[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {re.split(r"[<>=!~;\[ ]", d, maxsplit=1)[0].strip().lower().replace("-", "_") for d in meta["dependencies"]}


def _imports() -> dict[str, list[tuple[str, int, bool]]]:
    """Top-level module name -> (file, line, at module level) of every import of it."""
    found: dict[str, list[tuple[str, int, bool]]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        top_level = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top != "aiocollect" and top not in sys.stdlib_module_names:
                    where = (str(path.relative_to(ROOT)), node.lineno, id(node) in top_level)
                    found.setdefault(top, []).append(where)
    return found


def test_every_imported_module_is_a_declared_dependency() -> None:
    declared = _declared()
    missing = {
        top: places
        for top, places in _imports().items()
        if DISTRIBUTION.get(top, top).lower() not in declared and top not in OPTIONAL
    }
    assert not missing, f"imported but not in [project].dependencies: {missing}"


def test_optional_modules_are_imported_lazily() -> None:
    eager = {top: [p for p in places if p[2]] for top, places in _imports().items() if top in OPTIONAL}
    assert not any(eager.values()), f"optional modules imported at module level: {eager}"


def test_the_check_sees_the_imports_it_must_see() -> None:
    # Guards the check itself: it finds both module-level and function-level imports.
    found = _imports()
    assert any(level for _, _, level in found["torch"])
    assert any(not level for _, _, level in found["cloudpickle"])  # imported inside the worker
