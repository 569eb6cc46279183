"""What TorchRL's remote helpers (``map_fn``, ``get_distant_attr``, ``cascade_execute``) share.

An attribute path is TorchRL's: names joined by dots, each followed by any number of
``[index]`` subscripts (``"env.transform[0].loc"``, ``"_schemes['policy'].interval"``).
Resolving one reads attributes and items, nothing else: no code in the path is evaluated.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["call_lists", "call_path", "resolve_path"]

_PART = re.compile(r"^([A-Za-z_]\w*)?((?:\[[^\]]+\])*)$")
_SUBSCRIPT = re.compile(r"\[([^\]]+)\]")


def _key(text: str) -> Any:
    try:
        return ast.literal_eval(text)  # 0, -1, 'name', "name"
    except (ValueError, SyntaxError):
        return text.strip()  # a bare word: TorchRL reads it as a string key


def resolve_path(obj: Any, path: str) -> Any:
    """The object at attribute path ``path`` of ``obj`` (see the module docstring).

    Raises:
        TypeError: ``path`` is not a non-empty str.
        ValueError: A part of ``path`` is not a name with subscripts.
        AttributeError, KeyError, IndexError: The path does not exist (raised as is).
    """
    if not isinstance(path, str) or not path:
        raise TypeError(f"an attribute path must be a non-empty str such as 'env.batch_size', got {path!r}")
    for part in path.split("."):
        match = _PART.match(part)
        if match is None or part == "":
            raise ValueError(
                f"attribute path {path!r} has a part {part!r} that is not a name followed by [index] subscripts; "
                "write it as 'name', 'name[0]' or \"name['key']\""
            )
        name, subscripts = match.groups()
        if name:
            obj = getattr(obj, name)
        for key in _SUBSCRIPT.findall(subscripts):
            obj = obj[_key(key)]
    return obj


def call_lists(
    list_of_args: Sequence[Any] | None, list_of_kwargs: Sequence[Any] | None, workers: int | None = None
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """``(args, kwargs)`` of each call of ``map_fn``, by TorchRL's rules.

    In-process (``workers`` is None): one call per entry, one call with no arguments if
    neither list is given. With ``workers``: one call per worker, so a list must have exactly
    ``workers`` entries.

    Raises:
        TypeError: A list is not a list or tuple, or an entry of ``list_of_kwargs`` is not a dict.
        ValueError: The lists' lengths differ (in-process), or differ from ``workers``.
    """
    for name, value in (("list_of_args", list_of_args), ("list_of_kwargs", list_of_kwargs)):
        if value is not None and not isinstance(value, (list, tuple)):
            raise TypeError(f"{name} must be a list (one entry per call) or None, got {type(value).__name__}")
    if workers is None:
        if list_of_args is None:
            list_of_args = [()] * len(list_of_kwargs) if list_of_kwargs else [()]
        if list_of_kwargs is None:
            list_of_kwargs = [{}] * len(list_of_args)
        if len(list_of_args) != len(list_of_kwargs):
            raise ValueError(
                f"list_of_args and list_of_kwargs must have the same length (one entry per call), got "
                f"{len(list_of_args)} and {len(list_of_kwargs)}"
            )
    else:
        if list_of_args is None:
            list_of_args = [()] * (len(list_of_kwargs) if list_of_kwargs is not None else workers)
        if list_of_kwargs is None:
            list_of_kwargs = [{}] * len(list_of_args)
        if len(list_of_args) != workers:
            raise ValueError(
                f"Expected {workers} argument entries (one per worker), got {len(list_of_args)}; give list_of_args "
                "one tuple per worker"
            )
        if len(list_of_kwargs) != workers:
            raise ValueError(
                f"Expected {workers} keyword-argument entries (one per worker), got {len(list_of_kwargs)}; give "
                "list_of_kwargs one dict per worker"
            )
    for kwargs in list_of_kwargs:
        if not isinstance(kwargs, dict):
            raise TypeError(f"each entry of list_of_kwargs must be a dict, got {kwargs!r}")
    return [(tuple(args), dict(kwargs)) for args, kwargs in zip(list_of_args, list_of_kwargs, strict=True)]


def call_path(obj: Any, path: str, args: tuple[Any, ...] | None, kwargs: dict[str, Any]) -> Any:
    """Resolve ``path`` on ``obj`` and call it with ``args``/``kwargs``, or return it if ``args`` is None.

    What the call returns is returned as is (an async method's coroutine included: the
    caller awaits it where there is a loop).

    Raises:
        AttributeError: ``args`` were given but ``path`` is not callable.
    """
    target = resolve_path(obj, path)
    if args is None:
        return target
    if not callable(target):
        kind = type(target).__name__
        raise AttributeError(f"{path!r} is not callable (it is a {kind}); read it with get_distant_attr instead")
    return target(*args, **kwargs)
