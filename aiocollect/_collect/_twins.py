"""Blocking twins' signatures and docstrings, built from their async classes at import time.

A blocking twin (`DataCollectorBase` subclasses, `aiocollect.blocking.ReplayBuffer`) takes
exactly its async class's arguments: `twin_init` gives its ``__init__`` that signature and
`twin_doc` fills its docstring's ``{args}`` line from the async class's documentation, so the
async class's docstring is the one source of the text.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections.abc import Callable
from typing import Any

__all__ = ["twin_doc", "twin_init"]


def twin_init(cls: type, async_cls: type[Any], init: Callable[..., None]) -> Callable[..., None]:
    """An ``__init__`` for blocking twin ``cls`` that calls ``init`` and shows ``async_cls``'s signature.

    ``help()``, ``inspect.signature`` and IDEs that read ``__signature__`` then list the
    real arguments instead of ``*args, **kwargs``.
    """

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)

    # The class's signature, not its __init__'s: a front door (`Collector`) adds its selectors there.
    sig = inspect.signature(async_cls)
    self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    __init__.__signature__ = sig.replace(parameters=[self_param, *sig.parameters.values()])  # type: ignore[attr-defined]
    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__module__ = cls.__module__
    # The public path: an aiocollect class's __module__ is private until aiocollect's __getattr__ fixes it up.
    module = "aiocollect" if async_cls.__module__.startswith("aiocollect") else async_cls.__module__
    __init__.__doc__ = f"Takes the arguments of `{module}.{async_cls.__qualname__}`, described above."
    return __init__


# -- twin docstrings ---------------------------------------------------------------------------
# A twin's docstring is a template whose ``{args}`` line stands for its async class's
# documentation: the description, then Args (one entry per parameter, in signature order) and
# Raises. Built at import time, so the async class's docstring is the one source of the text.
_SECTIONS = ("Args", "Attributes", "Example", "Examples", "Note", "Notes", "Raises", "Returns", "Warning", "Yields")
_SECTION = re.compile(rf"^({'|'.join(_SECTIONS)}):$")
_ENTRY = re.compile(r"^    (\*{0,2}\w+)(?: \([^)]*\))?:(?: |$)")


def _sections(obj: object) -> tuple[list[str], dict[str, list[str]]]:
    """``obj``'s cleaned docstring as its description lines and its Google-style sections."""
    description: list[str] = []
    sections: dict[str, list[str]] = {}
    current = description
    for line in inspect.cleandoc(getattr(obj, "__doc__", None) or "").splitlines():
        match = _SECTION.match(line)
        current = sections.setdefault(match.group(1), []) if match else current
        if not match:
            current.append(line)
    return description, sections


def _entries(args: list[str]) -> dict[str, list[str]]:
    """The entries of an Args section, by parameter name (``**others`` included)."""
    entries: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in args:
        match = _ENTRY.match(line)
        if match:
            lines = entries[match.group(1)] = [line]
        elif line.strip():
            lines.append(line)
    return entries


def _trimmed(lines: list[str]) -> list[str]:
    text = "\n".join(lines).strip("\n")
    return text.splitlines() if text else []


def twin_doc(cls: type, async_cls: type[Any]) -> str | None:
    """``cls``'s docstring with its ``{args}`` line replaced by ``async_cls``'s documentation.

    The Args section lists every parameter of ``async_cls``'s signature; one it does not
    describe itself (a ``**others`` entry refers to them) takes the description of the
    nearest base class that has one, else `Collector`'s, where the shared arguments are
    declared. Its Examples are left out: the twin shows its own, blocking, usage. A
    docstring without an ``{args}`` line (a user's own twin) is returned unchanged.
    """
    from ._collector import Collector

    if "{args}" not in (cls.__doc__ or ""):
        return cls.__doc__
    description, sections = _sections(async_cls)
    own = _entries(sections.pop("Args", []))
    others = own.pop("**others", None)
    sources = [own] + [
        _entries(_sections(base)[1].get("Args", []))
        for base in (*async_cls.__mro__[1:], Collector)
        if base.__module__.startswith("aiocollect")
    ]
    parts = _trimmed(description)
    if others is not None:  # "**others: Every other argument has ..." becomes a paragraph
        text = " ".join(line.strip() for line in others).removeprefix("**others:").strip()
        parts += ["", *textwrap.wrap(text, 92)]
    parts += ["", "Args:"]
    for name in inspect.signature(async_cls).parameters:
        parts += next((source[name] for source in sources if name in source), [])
    for title, lines in sections.items():
        if title not in ("Example", "Examples"):
            parts += ["", f"{title}:", *_trimmed(lines)]
    return inspect.cleandoc(cls.__doc__ or "").replace("{args}", "\n".join(parts))
