"""The package layout: private subpackages in layers, no module importing upward, no cycles.

Layers, lowest first: ``_core`` < ``_envs`` < ``_buffer`` < ``_rollout`` < ``_serve`` < ``_workers`` <
``_collect`` < ``_multi`` < the public modules (``__init__``, ``blocking``, ``testing``). Every
import counts, at module level, inside functions and under ``TYPE_CHECKING``: a lazy import
that goes upward is still a dependency the wrong way.
"""

from __future__ import annotations

import ast
import pathlib
from collections.abc import Iterator

import pytest

PKG = pathlib.Path(__file__).resolve().parent.parent / "aiocollect"
LAYERS = ["_core", "_envs", "_buffer", "_rollout", "_workers", "_serve", "_collect", "_multi", "_dist"]
PUBLIC = len(LAYERS)
MAX_LINES = 500


def module_name(path: pathlib.Path) -> str:
    parts = ["aiocollect", *path.relative_to(PKG).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in LAYERS:
        return LAYERS.index(parts[1])
    if module == "aiocollect._version":
        return 0
    return PUBLIC


def imports(path: pathlib.Path) -> Iterator[tuple[str, int]]:
    """``(imported aiocollect module, line)`` for every import in ``path``."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            if not target.startswith("aiocollect"):
                continue
            for alias in node.names:  # `from ._buffer import _buffer` imports a module
                sub = f"{target}.{alias.name}"
                is_module = (PKG.parent / sub.replace(".", "/")).with_suffix(".py").exists()
                yield (sub if is_module else target), node.lineno
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("aiocollect"):
                    yield alias.name, node.lineno


MODULES = sorted(PKG.rglob("*.py"))


def test_every_private_module_sits_in_a_layer() -> None:
    loose = [module_name(p) for p in MODULES if layer(module_name(p)) == PUBLIC]
    assert sorted(loose) == ["aiocollect", "aiocollect.blocking", "aiocollect.node", "aiocollect.testing"]


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_no_module_imports_upward(path: pathlib.Path) -> None:
    here = layer(module_name(path))
    upward = [f"line {line}: {target}" for target, line in imports(path) if layer(target) > here]
    assert upward == [], f"{module_name(path)} ({[*LAYERS, 'public'][here]}) imports a higher layer"


def test_no_import_cycles() -> None:
    graph = {module_name(p): {t for t, _ in imports(p) if t != module_name(p)} for p in MODULES}
    # A package's __init__ runs before its modules: a module importing its own package
    # (or a parent package) is not a cycle.
    graph = {m: {t for t in deps if not m.startswith(t + ".")} for m, deps in graph.items()}
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                cycles.append([*stack[stack.index(t) :], t])
            elif t not in state:
                visit(t, [*stack, t])
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [m])
    assert cycles == []


def test_the_checks_see_imports() -> None:
    # The checks above pass vacuously if import resolution breaks: pin one known edge.
    loop = PKG / "_workers" / "_loop.py"
    assert "aiocollect._rollout._factory" in {t for t, _ in imports(loop)}


@pytest.mark.parametrize("path", MODULES, ids=module_name)
def test_modules_stay_small(path: pathlib.Path) -> None:
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{module_name(path)} has {lines} lines; split it by concept"
