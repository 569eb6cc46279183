"""Argument checks shared by every constructor: one grammar for every message.

A value of the wrong type raises ``TypeError`` and a value of the right type but out of
range raises ``ValueError`` (trio's rule); both say the rule and the value:
``frames_per_batch must be a positive int, got 0``. ``bool`` is never accepted as a number,
and ``2.0`` or ``"2"`` are never accepted as ints.
"""

from __future__ import annotations

import math
from typing import Any, Literal, overload

__all__ = ["check_bool", "check_choice", "check_int", "check_seconds"]


def _int_rule(minimum: int, allow_none: bool) -> str:
    kind = "a positive int" if minimum == 1 else f"an int >= {minimum}"
    return kind + (" or None" if allow_none else "")


def check_int(name: str, value: Any, *, minimum: int = 1, allow_none: bool = False, rule: str | None = None) -> Any:
    """Return ``value`` if it is an int ``>= minimum`` (or ``None`` when allowed).

    Args:
        name: The argument's name, as the user wrote it.
        value: What the user passed.
        minimum: The smallest allowed value.
        allow_none: Whether ``None`` is accepted (and returned).
        rule: The rule as the message states it (default: derived from ``minimum``).

    Raises:
        TypeError: ``value`` is not an int (``bool``, ``float`` and ``str`` included).
        ValueError: ``value`` is smaller than ``minimum``.
    """
    if value is None and allow_none:
        return None
    rule = rule or _int_rule(minimum, allow_none)
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return value


@overload
def check_seconds(name: str, value: Any, *, allow_none: Literal[False] = False) -> float: ...
@overload
def check_seconds(name: str, value: Any, *, allow_none: bool) -> float | None: ...
def check_seconds(name: str, value: Any, *, allow_none: bool = False) -> float | None:
    """Return ``value`` as a float if it is a positive, finite number of seconds.

    Raises:
        TypeError: ``value`` is not a real number.
        ValueError: ``value`` is not positive and finite.
    """
    if value is None and allow_none:
        return None
    rule = "a positive number of seconds" + (" or None" if allow_none else "")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be {rule}, got {value!r}")
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be {rule}, got {value!r}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool.

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_choice(name: str, value: Any, allowed: tuple[str, str]) -> str:
    """Return ``value`` if it is one of the two ``allowed`` strings.

    Raises:
        ValueError: ``value`` is anything else (``"on_error must be 'raise' or 'reset', got 'x'"``).
    """
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be {allowed[0]!r} or {allowed[1]!r}, got {value!r}")
    return value
